"""N-D parallelism on 4 gloo ranks through both front doors, against one process on the same batches.

2-D (tensor parallel 2 x FSDP 2) and HSDP (replicate 2 x shard 2) runs must end with the weights
of one process training on each step's combined batch (tolerance 1e-5: tensor parallelism and
sharding change the summation order only). The ranks of one tensor-parallel group must see the
same batches and the data-parallel groups disjoint parts that cover the data set. A checkpoint
written on tp=2 x dp=2 (4 processes) must load on dp=2 (2 processes) and continue to the
uninterrupted result, and consolidate into one file.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader

import drivetrain as dt
from drivetrain.strategies import ModelParallelStrategy, ParallelLayout
from helpers.model_parallel import LR, PER_RANK, PLAN, TPNet, dataset, loss_of, part, reference_run
from helpers.multiprocess import run_processes
from helpers.scripts import run_command
from trainer.trainer_models import Regression, loader, quiet_trainer, regression_data

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(240)]

LAYOUTS = {
    "tp2_x_fsdp2": {"dp_shard_size": 2, "tp_size": 2},
    "hsdp_2x2": {"dp_replicate_size": 2, "dp_shard_size": 2},
}
STEPS = 3


def _accelerator_rank(rank: int, world_size: int, sizes: dict[str, int]) -> dict[str, Any]:
    config = dt.ParallelismConfig(**sizes)
    accelerator = dt.Accelerator(
        cpu=True, parallelism_config=config, tp_plan=PLAN if config.tp_enabled else None
    )
    data_parallel = accelerator.strategy.distributed_sampler_kwargs["num_replicas"]
    torch.manual_seed(0)
    model = TPNet()
    optimizer = torch.optim.Adam(model.parameters(), lr=LR)
    train = DataLoader(dataset(STEPS, data_parallel), batch_size=PER_RANK)
    model, optimizer, train = accelerator.prepare(model, optimizer, train)
    seen, losses = [], []
    for x, y in train:
        seen.append(x.clone())
        loss = loss_of(model(x), y)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    mesh = accelerator.torch_device_mesh
    return {
        "seen": seen,
        "losses": losses,
        "state": accelerator.get_state_dict(model),
        "dp_rank": accelerator.strategy.distributed_sampler_kwargs["rank"],
        "tp_group": mesh["tensor_parallel"].mesh.tolist(),
    }


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_accelerator_trains_like_one_process_and_shares_data_over_data_parallel_ranks_only(name: str) -> None:
    sizes = LAYOUTS[name]
    results = run_processes(_accelerator_rank, 4, args=(sizes,), timeout=200)
    data_parallel = sizes.get("dp_replicate_size", 1) * sizes["dp_shard_size"]
    reference = reference_run(STEPS, data_parallel)
    data = dataset(STEPS, data_parallel)
    for result in results:
        dp_rank = result["dp_rank"]
        for step, x in enumerate(result["seen"]):
            torch.testing.assert_close(x, part(data, step, dp_rank, data_parallel)[0], atol=0, rtol=0)
        assert result["losses"] == pytest.approx([step[dp_rank] for step in reference["losses"]], abs=1e-5)
    # Ranks of one tensor-parallel group read the same share; the shares are disjoint and cover the data.
    assert sorted(r["dp_rank"] for r in results) == sorted(
        d for d in range(data_parallel) for _ in range(4 // data_parallel)
    )
    if "tp_size" in sizes:
        assert results[0]["tp_group"] == [0, 1] and results[2]["tp_group"] == [2, 3]
        for a, b in ((0, 1), (2, 3)):
            assert all(torch.equal(x, y) for x, y in zip(results[a]["seen"], results[b]["seen"]))
    covered = torch.cat([x for r in results for x in r["seen"]]).unique(dim=0)
    assert covered.shape[0] == len(data) == STEPS * PER_RANK * data_parallel
    for key, expected in reference["state"].items():
        torch.testing.assert_close(results[0]["state"][key], expected, atol=1e-5, rtol=0)


class TPRegression(Regression):
    """Lightning's pattern: tensor parallelism applied in configure_model on self.device_mesh.

    With ``shard_itself``, configure_model applies fully_shard over the data-parallel mesh too,
    block by block (as Lightning's examples do); otherwise the strategy does.
    """

    shard_itself = False

    def configure_model(self) -> None:
        from torch.distributed.fsdp import FSDPModule, fully_shard
        from torch.distributed.tensor import DTensor
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

        tp_mesh = self.device_mesh["tensor_parallel"]
        if tp_mesh.size() > 1 and not isinstance(self.net[0].weight, DTensor):
            parallelize_module(self.net, tp_mesh, {"0": ColwiseParallel(), "3": RowwiseParallel()})
        if self.shard_itself and not isinstance(self.net, FSDPModule):
            dp_mesh = self.device_mesh["data_parallel"]
            fully_shard(self.net[0], mesh=dp_mesh)
            fully_shard(self.net, mesh=dp_mesh)


def _trainer_rank(rank: int, world_size: int, layout: ParallelLayout, shard_itself: bool) -> dict[str, Any]:
    # The model ends in the row-wise layer, whose output is a view of the all-reduced tensor, and
    # FSDP2 warns that an in-place op on it would skip its backward hook; the step makes none.
    warnings.filterwarnings(
        "ignore", message=r"FSDP2-wrapped module .* returned a view tensor", category=UserWarning
    )
    torch.manual_seed(0)
    model = TPRegression(lr=0.1)
    model.shard_itself = shard_itself
    # Two batches per step for one epoch: the no-sync context of accumulation covers every FSDP group.
    trainer = quiet_trainer(
        strategy=ModelParallelStrategy(layout=layout), devices=4, max_epochs=2, accumulate_grad_batches=2
    )
    trainer.fit(model, loader(regression_data(64), batch_size=4))
    return {"state": trainer.strategy.get_module_state_dict(model), "steps": trainer.global_step}


@pytest.mark.parametrize(
    ("layout", "data_parallel", "shard_itself"),
    [
        (ParallelLayout(dp_shard=2, tp=2), 2, False),
        (ParallelLayout(dp_shard=2, tp=2), 2, True),
        (ParallelLayout(dp_replicate=2, dp_shard=2), 4, False),
    ],
    ids=["tp2_x_fsdp2", "tp2_x_fsdp2_sharded_in_configure_model", "hsdp_2x2"],
)
def test_trainer_trains_like_one_process(
    layout: ParallelLayout, data_parallel: int, shard_itself: bool
) -> None:
    main = run_processes(_trainer_rank, 4, args=(layout, shard_itself), timeout=200)[0]
    # The one-process run in a child too: a Trainer run in the test process would leave torch's
    # thread pool there, and a later test forking from it can hang in its children.
    single = run_processes(_single_trainer, 1, args=(4 * data_parallel,), process_group=False, timeout=200)[0]
    assert main["steps"] == single["steps"] == 64 // (4 * data_parallel)
    for key, expected in single["state"].items():
        torch.testing.assert_close(main["state"][key], expected, atol=1e-5, rtol=0)


def _single_trainer(rank: int, world_size: int, batch_size: int) -> dict[str, Any]:
    torch.manual_seed(0)
    model = Regression(lr=0.1)
    trainer = quiet_trainer(max_epochs=2, accumulate_grad_batches=2)
    trainer.fit(model, loader(regression_data(64), batch_size=batch_size))  # the combined batches
    return {"state": model.state_dict(), "steps": trainer.global_step}


def _train_steps(
    accelerator: dt.Accelerator, model: Any, optimizer: Any, steps: range, data_parallel: int
) -> None:
    data = dataset(4, data_parallel)
    dp_rank = accelerator.strategy.distributed_sampler_kwargs["rank"]
    for step in steps:
        x, y = part(data, step, dp_rank, data_parallel)
        accelerator.backward(loss_of(model(x), y))
        optimizer.step()
        optimizer.zero_grad()


def _save_on_tp2_x_dp2(rank: int, world_size: int, folder: str) -> dict[str, Any]:
    config = dt.ParallelismConfig(dp_shard_size=2, tp_size=2)
    accelerator = dt.Accelerator(cpu=True, parallelism_config=config, tp_plan=PLAN)
    torch.manual_seed(0)
    model = TPNet()
    model, optimizer = accelerator.prepare(model, torch.optim.Adam(model.parameters(), lr=LR))
    _train_steps(accelerator, model, optimizer, range(2), data_parallel=2)
    accelerator.save_state(folder)
    return {"state": accelerator.get_state_dict(model)}


def _resume_on_dp2(rank: int, world_size: int, folder: str) -> dict[str, Any]:
    accelerator = dt.Accelerator(cpu=True, parallelism_config=dt.ParallelismConfig(dp_shard_size=2))
    torch.manual_seed(123)  # other initial weights: everything must come from the checkpoint
    model = TPNet()
    model, optimizer = accelerator.prepare(model, torch.optim.Adam(model.parameters(), lr=LR))
    with warnings.catch_warnings():
        # "saved by 4 process(es) and is resumed by 2": the generators are not used by this run.
        warnings.filterwarnings("ignore", message=".*saved by 4 process.*resumed by 2", category=UserWarning)
        accelerator.load_state(folder)
    _train_steps(accelerator, model, optimizer, range(2, 4), data_parallel=2)
    return {"state": accelerator.get_state_dict(model)}


def test_a_checkpoint_saved_on_tp2_x_dp2_resumes_on_dp2_and_consolidates(tmp_path: Path) -> None:
    folder = str(tmp_path / "run")
    saved = run_processes(_save_on_tp2_x_dp2, 4, args=(folder,), timeout=200)[0]
    halfway = reference_run(4, 2, stop_after=2)
    for key, expected in halfway["state"].items():
        torch.testing.assert_close(saved["state"][key], expected, atol=1e-5, rtol=0)

    resumed = run_processes(_resume_on_dp2, 2, args=(folder,), timeout=200)[0]
    uninterrupted = reference_run(4, 2)
    for key, expected in uninterrupted["state"].items():
        torch.testing.assert_close(resumed["state"][key], expected, atol=1e-5, rtol=0)

    # One file, through the command line, loadable in one process without a process group.
    sharded = Path(folder) / "state.ckpt"
    single_file = tmp_path / "consolidated.pt"
    completed = run_command(
        [sys.executable, "-m", "drivetrain", "consolidate", str(sharded), str(single_file)]
    )
    assert completed.returncode == 0, completed.stderr
    checkpoint = torch.load(single_file, weights_only=True)
    for key, expected in halfway["state"].items():
        torch.testing.assert_close(checkpoint["state_dict"][key], expected, atol=1e-5, rtol=0)


def _trainer_save_on_tp2_x_dp2(rank: int, world_size: int, path: str) -> None:
    warnings.filterwarnings(
        "ignore", message=r"FSDP2-wrapped module .* returned a view tensor", category=UserWarning
    )
    torch.manual_seed(0)
    model = TPRegression(lr=0.1)
    strategy = ModelParallelStrategy(layout=ParallelLayout(dp_shard=2, tp=2))
    trainer = quiet_trainer(strategy=strategy, devices=4, max_epochs=1, gradient_clip_val=0.5)
    trainer.fit(model, loader(regression_data(64), batch_size=4))
    trainer.save_checkpoint(path)


def _trainer_resume_on_dp2(rank: int, world_size: int, path: str) -> dict[str, Any]:
    warnings.filterwarnings("ignore", message=".*saved by 4 process.*resumed by 2", category=UserWarning)
    torch.manual_seed(123)  # other initial weights: everything must come from the checkpoint
    model = TPRegression(lr=0.1)
    strategy = ModelParallelStrategy(layout=ParallelLayout(dp_shard=2))
    trainer = quiet_trainer(strategy=strategy, devices=2, max_epochs=2, gradient_clip_val=0.5)
    trainer.fit(model, loader(regression_data(64), batch_size=4), ckpt_path=path)
    return {"state": trainer.strategy.get_module_state_dict(model), "steps": trainer.global_step}


def _single_clipped_trainer(rank: int, world_size: int) -> dict[str, Any]:
    torch.manual_seed(0)
    model = Regression(lr=0.1)
    trainer = quiet_trainer(max_epochs=2, gradient_clip_val=0.5)
    trainer.fit(model, loader(regression_data(64), batch_size=8))
    return {"state": model.state_dict(), "steps": trainer.global_step}


def test_a_trainer_checkpoint_saved_on_tp2_x_dp2_resumes_on_dp2(tmp_path: Path) -> None:
    path = str(tmp_path / "epoch1.ckpt")
    run_processes(_trainer_save_on_tp2_x_dp2, 4, args=(path,), timeout=200)
    resumed = run_processes(_trainer_resume_on_dp2, 2, args=(path,), timeout=200)[0]
    single = run_processes(_single_clipped_trainer, 1, process_group=False, timeout=200)[0]
    assert resumed["steps"] == single["steps"] == 16
    for key, expected in single["state"].items():
        torch.testing.assert_close(resumed["state"][key], expected, atol=1e-5, rtol=0)


def _mistakes(rank: int, world_size: int) -> list[str]:
    errors = []
    cases = [
        (dt.ParallelismConfig(tp_size=2), {"up": "colwise", "missing": "rowwise"}, TPNet()),  # names no layer
        (dt.ParallelismConfig(dp_shard_size=2), {"up": "colwise"}, TPNet()),  # a plan, but tp=1
        (
            dt.ParallelismConfig(tp_size=2),
            {"0": "colwise"},
            torch.nn.Sequential(torch.nn.Linear(4, 5)),
        ),  # 5 / 2
    ]
    for config, plan, model in cases:
        accelerator = dt.Accelerator(cpu=True, parallelism_config=config, tp_plan=plan)
        try:
            accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
        except ValueError as error:
            errors.append(str(error))
    trainer = quiet_trainer(strategy=ModelParallelStrategy(1, 2), devices=2, max_epochs=1)
    try:
        trainer.fit(Regression(), loader(regression_data(16), batch_size=4))  # tp=2, but nothing is split
    except ValueError as error:
        errors.append(str(error))
    trainer = quiet_trainer(strategy=ModelParallelStrategy(2, 1), devices=2, max_epochs=1)
    try:
        trainer.fit(PartlySharded(), loader(regression_data(16), batch_size=4))
    except ValueError as error:
        errors.append(str(error))
    return errors


class PartlySharded(Regression):
    def configure_model(self) -> None:
        from torch.distributed.fsdp import fully_shard

        fully_shard(self.net[0], mesh=self.device_mesh["data_parallel"])  # net.3 left out


def test_tensor_parallel_mistakes_are_clear_errors() -> None:
    errors = run_processes(_mistakes, 2, timeout=200)[0]
    assert len(errors) == 5, errors
    assert "tp_plan entry 'missing' matches no submodule of TPNet" in errors[0]
    assert "got a tp_plan, but the layout has tp=1" in errors[1]
    assert "0.weight (shape (5, 4)) is split along dimension 0 of size 5 over tp=2 ranks" in errors[2]
    assert "The layout has tp=2, but Regression has no tensor-parallel parameters" in errors[3]
    assert "2 parameter(s) are in no FSDP group (net.3.weight, net.3.bias)" in errors[4]
