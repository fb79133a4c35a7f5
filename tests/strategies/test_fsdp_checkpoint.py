"""FSDP checkpoints in 2-process gloo jobs: sharded and full save/load, resume, consolidation.

Resuming must reproduce the uninterrupted run exactly (bit for bit) on CPU, including Adam's
state and a ``Linear(64, 1)`` head with fewer rows than ranks.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import drivetrain as dt
from drivetrain.strategies import FSDPStrategy
from drivetrain.strategies.consolidate import checkpoint_kind
from drivetrain.strategies.fsdp import consolidate_checkpoint
from drivetrain.trainer import Callback, ModelCheckpoint
from helpers.multiprocess import run_processes
from helpers.sharded import LR, Net, batches, loss_of, numel, shard
from trainer.trainer_models import Regression

pytestmark = pytest.mark.multiprocess


class _Counter:
    """A stateful object that is neither a module nor an optimizer (a scheduler, say)."""

    def __init__(self) -> None:
        self.count = 0

    def state_dict(self) -> dict[str, int]:
        return {"count": self.count}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.count = state["count"]


def _build(strategy: FSDPStrategy, empty_init: bool) -> tuple[nn.Module, Any]:
    torch.manual_seed(0 if not empty_init else 123)
    with strategy.module_init_context(empty_init=empty_init):
        model = Net()
    optimizer = torch.optim.Adam(model.parameters(), lr=LR)
    model, [optimizer] = strategy.setup_module_and_optimizers(model, [optimizer])
    return model, optimizer


def _steps(strategy: FSDPStrategy, model: nn.Module, optimizer: Any, rank: int, data: list[Any]) -> None:
    for batch in data:
        x, y = shard(batch, rank)
        strategy.backward(loss_of(model(x), y), model)
        strategy.optimizer_step(optimizer, model=model)
        optimizer.zero_grad()


def _resume_rank(rank: int, world_size: int, folder: str) -> dict[str, Any]:
    strategy = dt.connect(
        accelerator="cpu", strategy=FSDPStrategy(auto_wrap_policy={nn.Linear}), devices=world_size
    )
    strategy.setup_environment()
    data = batches(4)
    sharded, full = os.path.join(folder, "sharded"), os.path.join(folder, "full.pt")

    model, optimizer = _build(strategy, empty_init=False)
    _steps(strategy, model, optimizer, rank, data[:2])
    counter = _Counter()
    counter.count = 2
    strategy.save_state(
        sharded, {"model": model, "optimizer": optimizer, "counter": counter, "step": 2, "note": "hi"}
    )
    strategy.state_dict_type = "full"
    strategy.save_state(full, {"model": model, "optimizer": optimizer, "step": 2})
    strategy.state_dict_type = "sharded"
    at_save = strategy.get_module_state_dict(model)
    _steps(strategy, model, optimizer, rank, data[2:])
    uninterrupted = strategy.get_module_state_dict(model)

    # Resume from the sharded directory into a model built on the meta device.
    model, optimizer = _build(strategy, empty_init=True)
    local_after_meta_init = numel(model.parameters())
    counter = _Counter()
    state = {"model": model, "optimizer": optimizer, "counter": counter, "step": 0}
    rest = strategy.load_state(sharded, state)
    _steps(strategy, model, optimizer, rank, data[2:])
    from_sharded = strategy.get_module_state_dict(model)

    # Resume from the full file.
    model, optimizer = _build(strategy, empty_init=False)
    full_state = {"model": model, "optimizer": optimizer, "step": 0}
    strategy.load_state(full, full_state)
    _steps(strategy, model, optimizer, rank, data[2:])
    from_full = strategy.get_module_state_dict(model)

    errors = {}
    try:
        strategy.load_state(sharded, {"model": model, "missing": 0})
    except KeyError as error:
        errors["missing"] = str(error)
    try:
        strategy.load_state(sharded, {"model": optimizer})
    except TypeError as error:
        errors["kind"] = str(error)
    return {
        "at_save": at_save,
        "uninterrupted": uninterrupted,
        "from_sharded": from_sharded,
        "from_full": from_full,
        "rest": rest,
        "step": (state["step"], full_state["step"]),
        "counter": counter.count,
        "local_after_meta_init": local_after_meta_init,
        "files": sorted(os.listdir(sharded)),
        "errors": errors,
    }


def test_save_load_resume_and_consolidate(tmp_path: Path) -> None:
    results = run_processes(_resume_rank, 2, args=(str(tmp_path),), timeout=90)
    main = results[0]
    for key in ("from_sharded", "from_full"):
        assert main[key].keys() == main["uninterrupted"].keys()
        for name, expected in main["uninterrupted"].items():
            assert torch.equal(main[key][name], expected), f"{key}: {name} differs after resuming"
    assert main["step"] == (2, 2) and main["counter"] == 2 and main["rest"] == {"note": "hi"}
    assert main["files"] == [".metadata", "__0_0.distcp", "__1_0.distcp", "drivetrain_state.pt"]
    total = sum(t.numel() for t in main["at_save"].values())
    assert all(r["local_after_meta_init"] <= 0.55 * total for r in results)  # meta init allocates shards only
    assert "no entry for 'missing'" in main["errors"]["missing"]
    assert "is a sharded module, but state['model'] is a Adam" in main["errors"]["kind"]

    # Consolidation, in this (single, group-less) process, into a file that loads safely.
    assert checkpoint_kind(tmp_path / "sharded") == "fsdp"
    target = consolidate_checkpoint(tmp_path / "sharded", tmp_path / "out" / "one.pt")
    consolidated = torch.load(target, weights_only=True)
    assert (
        consolidated["step"] == 2 and consolidated["counter"] == {"count": 2} and consolidated["note"] == "hi"
    )
    for name, expected in main["at_save"].items():
        assert torch.equal(consolidated["model"][name], expected)
    assert set(consolidated["optimizer"]["state"]) == set(main["at_save"])  # keyed by parameter name

    # A plain single-device model and optimizer continue from it exactly like the 2-rank job.
    from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

    single = Net()
    single.load_state_dict(consolidated["model"])
    optimizer = torch.optim.Adam(single.parameters(), lr=LR)
    set_optimizer_state_dict(single, optimizer, consolidated["optimizer"])
    for batch in batches(4)[2:]:
        loss_of(single(batch[0]), batch[1]).backward()
        optimizer.step()
        optimizer.zero_grad()
    for name, expected in main["uninterrupted"].items():
        torch.testing.assert_close(single.state_dict()[name], expected, atol=1e-6, rtol=0)


def test_consolidation_refuses_what_it_cannot_read(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"No checkpoint at"):
        consolidate_checkpoint(tmp_path / "absent", tmp_path / "out.pt")
    (tmp_path / "plain").mkdir()
    with pytest.raises(ValueError, match=r"is not a sharded checkpoint drivetrain knows"):
        consolidate_checkpoint(tmp_path / "plain", tmp_path / "out.pt")


# -- through both front doors: the optimizer's own settings come back; a damaged folder is refused ------
class SteppedLr(Regression):
    """Adam at lr 0.01, raised to 0.123 by a per-step schedule after the first step (kept from then on)."""

    def __init__(self) -> None:
        super().__init__(optimizer="adam", lr=0.01)

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.Adam(self.parameters(), lr=0.01)
        scheduler = torch.optim.lr_scheduler.MultiStepLR(optimizer, milestones=[1], gamma=12.3)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


class OptimizerAtStart(Callback):
    def on_train_start(self, trainer: dt.Trainer, module: Any) -> None:
        optimizer = trainer.optimizers[0]
        self.lr = optimizer.param_groups[0]["lr"]
        self.steps = sorted({float(state["step"]) for state in optimizer.state.values()})


#: How a sharded checkpoint folder is damaged (a file removed, or cut to 100 bytes), and what loading it says.
DAMAGED = r"^DamagedCheckpointError: The checkpoint '[^']*/{folder}' is damaged or not a checkpoint: "
DAMAGE = {
    "missing shard": ("__1_0.distcp", None, r"the data file '__1_0\.distcp' its metadata names is missing"),
    "short shard": ("__0_0.distcp", 100, r"it is shorter than its metadata says"),
    "no metadata": (".metadata", None, r"its index of the shards \(DCP's \.metadata\) is missing"),
    "no header": (
        "drivetrain_state.pt",
        None,
        r"its drivetrain_state\.pt \(the entries not sharded\) is missing",
    ),
}


def _damage(folder: str, copy: str, how: str) -> None:
    import shutil

    shutil.copytree(folder, copy)
    name, keep, _ = DAMAGE[how]
    if keep is None:
        os.remove(os.path.join(copy, name))
    else:
        with open(os.path.join(copy, name), "r+b") as file:
            file.truncate(keep)


def _errors(load: Any, folders: dict[str, str]) -> dict[str, str]:
    errors = {}
    for how, folder in folders.items():
        try:
            load(folder)
            errors[how] = "loaded"
        except Exception as error:
            errors[how] = f"{type(error).__name__}: {error}"
    return errors


def _front_doors(rank: int, world_size: int, root: str) -> dict[str, Any]:
    def fit(ckpt_path: str | None) -> tuple[OptimizerAtStart, dict[str, torch.Tensor]]:
        torch.manual_seed(0)
        start = OptimizerAtStart()
        checkpoint = ModelCheckpoint(
            dirpath=os.path.join(root, "trainer"), every_n_train_steps=2, save_top_k=-1, filename="{step}"
        )
        trainer = dt.Trainer(
            accelerator="cpu",
            strategy="fsdp",
            devices=2,
            max_steps=4,
            callbacks=[start, checkpoint],
            logger=False,
            enable_progress_bar=False,
            enable_model_summary=False,
        )
        trainer.fit(SteppedLr(), torch.utils.data.DataLoader(_data(), batch_size=4), ckpt_path=ckpt_path)
        return start, {k: v.clone() for k, v in trainer.strategy.get_module_state_dict(trainer.model).items()}

    result: dict[str, Any] = {}
    _, full = fit(None)
    start, resumed = fit(os.path.join(root, "trainer", "step=2.ckpt"))
    result["trainer"] = {
        "lr": start.lr,
        "steps": start.steps,
        "same": all(torch.equal(full[k], resumed[k]) for k in full),
    }

    def accelerator_run() -> tuple[dt.Accelerator, nn.Module, Any]:
        accelerator = dt.Accelerator(accelerator="cpu", strategy="fsdp", devices=2)
        torch.manual_seed(0)
        model = Net()
        model, optimizer = accelerator.prepare(model, torch.optim.Adam(model.parameters(), lr=LR))
        return accelerator, model, optimizer

    def step(accelerator: dt.Accelerator, model: nn.Module, optimizer: Any, batch: Any) -> None:
        x, y = shard(batch, rank)
        accelerator.backward(loss_of(model(x), y))
        optimizer.step()
        optimizer.zero_grad()

    data = batches(4)
    accelerator, model, optimizer = accelerator_run()
    for batch in data[:2]:
        step(accelerator, model, optimizer, batch)
    optimizer.param_groups[0]["lr"] = 0.123
    state_dir = os.path.join(root, "accelerator")
    accelerator.save_state(state_dir)
    for batch in data[2:]:
        step(accelerator, model, optimizer, batch)
    full = {k: v.clone() for k, v in accelerator.get_state_dict(model).items()}
    accelerator, model, optimizer = accelerator_run()
    accelerator.load_state(state_dir)
    lr = optimizer.param_groups[0]["lr"]
    for batch in data[2:]:
        step(accelerator, model, optimizer, batch)
    resumed = accelerator.get_state_dict(model)
    result["accelerator"] = {"lr": lr, "same": all(torch.equal(full[k], resumed[k]) for k in full)}

    # Damaged copies of both doors' sharded folders: every rank gets the same clear error, none hangs.
    sources = {"trainer": os.path.join(root, "trainer", "step=2.ckpt"), "accelerator": state_dir}
    copies = {door: {how: os.path.join(root, "damaged", door, how) for how in DAMAGE} for door in sources}
    if rank == 0:
        for door, source in sources.items():
            inner = source if door == "trainer" else os.path.join(source, "state.ckpt")
            for how, copy in copies[door].items():
                if door == "accelerator":
                    os.makedirs(copy)
                    _damage(inner, os.path.join(copy, "state.ckpt"), how)
                else:
                    _damage(inner, copy, how)
    torch.distributed.barrier()
    result["trainer_errors"] = _errors(lambda path: fit(path), copies["trainer"])
    accelerator, model, optimizer = accelerator_run()
    result["accelerator_errors"] = _errors(accelerator.load_state, copies["accelerator"])
    return result


def _data() -> torch.utils.data.TensorDataset:
    x = torch.randn(32, 4, generator=torch.Generator().manual_seed(2))
    return torch.utils.data.TensorDataset(x, x.sum(dim=1, keepdim=True))


def test_both_doors_restore_the_optimizer_settings_and_refuse_damaged_folders(tmp_path: Path) -> None:
    for result in run_processes(_front_doors, 2, args=(str(tmp_path),), timeout=150):
        # The learning rate lives in the optimizer's param_groups, outside any sharded tensor: it comes
        # back only if the optimizer's state is set after DCP read it.
        assert result["trainer"]["lr"] == pytest.approx(0.123)
        assert result["trainer"]["steps"] == [2.0]
        assert result["trainer"]["same"]
        assert result["accelerator"]["lr"] == 0.123
        assert result["accelerator"]["same"]
        for door in ("trainer", "accelerator"):
            for how, (name, _, expected) in DAMAGE.items():
                error = result[f"{door}_errors"][how]
                folder = f"{how}/state.ckpt" if door == "accelerator" else how
                folder += f"/{name}" if how == "short shard" else ""  # the file that is short
                assert re.search(DAMAGED.format(folder=re.escape(folder)) + expected, error), (
                    door,
                    how,
                    error,
                )
