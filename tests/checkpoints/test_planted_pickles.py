"""No planted pickle runs through any loading path or command, with 1 and 2 processes.

Each test saves a real checkpoint through a public entry point, plants a payload that writes a
marker file when unpickled without restrictions, loads the checkpoint through a public entry
point and asserts the load is refused (naming that entry point's opt-out) and the marker never
appears.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import drivetrain as dt
from drivetrain._utilities.imports import package_available
from drivetrain.plugins.io.safe_loading import UnsafeCheckpointError
from drivetrain.trainer import ModelCheckpoint
from helpers.multiprocess import run_processes
from helpers.planted import (
    Payload,
    SystemPayload,
    add_dcp_bytes_entry,
    plant_in_dcp_metadata,
    plant_in_torch_file,
)
from helpers.scripts import run_command
from helpers.sharded import LR, Net, batches, loss_of, shard
from trainer.trainer_models import Regression, loader, quiet_trainer, regression_data

DRIVETRAIN = [sys.executable, "-m", "drivetrain"]


def _refused(error: pytest.ExceptionInfo[BaseException], opt_out: str) -> None:
    message = str(error.value)
    assert "safe loading refuses" in message and "exec" in message, message
    assert opt_out in message, message


# -- one process ---------------------------------------------------------------------------------
def _trainer_checkpoint(tmp_path: Path) -> Path:
    torch.manual_seed(0)
    trainer = quiet_trainer(
        max_epochs=1, enable_checkpointing=True, callbacks=[ModelCheckpoint(dirpath=tmp_path, filename="c")]
    )
    trainer.fit(Regression(), loader(regression_data(16)))
    return tmp_path / "c.ckpt"


@pytest.mark.parametrize("entry", ["fit", "validate", "test", "predict", "load_from_checkpoint"])
def test_trainer_entry_points_refuse_a_planted_checkpoint(tmp_path: Path, entry: str) -> None:
    path, marker = _trainer_checkpoint(tmp_path), tmp_path / "ran"
    plant_in_torch_file(path, marker)
    trainer = quiet_trainer(max_epochs=2)
    data = loader(regression_data(16))
    with pytest.raises(UnsafeCheckpointError) as error:
        if entry == "load_from_checkpoint":
            Regression.load_from_checkpoint(path)
        else:
            getattr(trainer, entry)(Regression(), data, ckpt_path=path)
    assert not marker.exists()
    if entry == "load_from_checkpoint":
        _refused(error, "Regression.load_from_checkpoint(path, weights_only=False)")
    else:
        _refused(error, f"Trainer.{entry}(..., ckpt_path=..., weights_only=False)")


def test_an_os_system_payload_is_refused_as_unsafe_not_reported_as_damage(tmp_path: Path) -> None:
    """torch 2.13 words this refusal differently ("unsupported GLOBAL posix.system whose module posix is blocked")."""
    path, marker = _trainer_checkpoint(tmp_path), tmp_path / "ran"
    plant_in_torch_file(path, marker, SystemPayload)
    with pytest.raises(UnsafeCheckpointError) as error:
        quiet_trainer().validate(Regression(), loader(regression_data(16)), ckpt_path=path)
    assert not marker.exists()
    message = str(error.value)
    assert "safe loading refuses" in message and "posix.system" in message, message
    assert "Trainer.validate(..., ckpt_path=..., weights_only=False)" in message, message


def test_the_trainer_opt_out_loads_a_trusted_checkpoint(tmp_path: Path) -> None:
    path, marker = _trainer_checkpoint(tmp_path), tmp_path / "ran"
    plant_in_torch_file(path, marker)
    quiet_trainer().validate(Regression(), loader(regression_data(16)), ckpt_path=path, weights_only=False)
    assert marker.exists()  # what the refusal above prevents


def test_accelerator_load_state_refuses_a_planted_state(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    accelerator = dt.Accelerator(cpu=True)
    model = accelerator.prepare(nn.Linear(3, 1))
    directory = accelerator.save_state(tmp_path / "state")
    plant_in_torch_file(Path(directory) / "state.ckpt", marker)
    with pytest.raises(UnsafeCheckpointError) as error:
        accelerator.load_state(directory)
    assert not marker.exists()
    _refused(error, "Accelerator.load_state(..., load_kwargs={'weights_only': False})")
    accelerator.load_state(directory, load_kwargs={"weights_only": False})
    assert marker.exists() and isinstance(model, nn.Module)


def test_accelerator_load_kwargs_are_checked(tmp_path: Path) -> None:
    accelerator = dt.Accelerator(cpu=True)
    with pytest.raises(ValueError, match="takes only 'weights_only'"):
        accelerator.load_state(tmp_path, load_kwargs={"map_location": "cpu"})
    with pytest.raises(TypeError, match="use True or False"):
        accelerator.load_state(tmp_path, load_kwargs={"weights_only": "no"})


def test_the_training_cli_refuses_a_planted_checkpoint(tmp_path: Path) -> None:
    path, marker = _trainer_checkpoint(tmp_path), tmp_path / "ran"
    plant_in_torch_file(path, marker)
    script = tmp_path / "train.py"
    script.write_text(
        "import sys\n"
        f"sys.path.insert(0, {str(Path(__file__).parents[1])!r})\n"
        "from drivetrain.cli import CLI\n"
        "from trainer.trainer_models import Regression, loader, regression_data\n"
        "import drivetrain as dt\n"
        "class Data(dt.DataModule):\n"
        "    def test_dataloader(self):\n"
        "        return loader(regression_data(16))\n"
        "CLI(Regression, Data)\n"
    )
    result = run_command(
        [
            sys.executable,
            str(script),
            "test",
            "--trainer.accelerator=cpu",
            "--trainer.logger=false",
            f"--ckpt_path={path}",
        ],
        timeout=120,
        cwd=tmp_path,
    )
    assert result.returncode != 0
    assert "safe loading refuses" in result.stderr and "weights_only=False" in result.stderr
    assert not marker.exists()


# -- two processes, sharded --------------------------------------------------------------------------
def _quiet() -> None:
    warnings.filterwarnings(
        "ignore", message=r".* is deprecated\. Please use .*_single", category=FutureWarning
    )
    warnings.filterwarnings(
        "ignore", message=r"`torch\.jit\.script_method` is deprecated", category=DeprecationWarning
    )


def _save_sharded(rank: int, world_size: int, folder: str, name: str, doors: tuple[str, ...]) -> None:
    _quiet()
    if "trainer" in doors:
        torch.manual_seed(0)
        trainer = quiet_trainer(
            strategy=name,
            devices=2,
            max_epochs=1,
            enable_checkpointing=True,
            callbacks=[ModelCheckpoint(dirpath=f"{folder}/trainer", filename="c")],
        )
        trainer.fit(Regression(), loader(regression_data(16), batch_size=4))
    if "accelerator" in doors:
        accelerator = dt.Accelerator(accelerator="cpu", strategy=name, devices=2)
        torch.manual_seed(0)
        model = Net()
        model, optimizer = accelerator.prepare(model, torch.optim.Adam(model.parameters(), lr=LR))
        x, y = shard(batches(1)[0], rank)
        accelerator.backward(loss_of(model(x), y))
        optimizer.step()
        accelerator.save_state(f"{folder}/accelerator")


def _load_sharded(
    rank: int, world_size: int, folder: str, name: str, doors: tuple[str, ...]
) -> dict[str, str]:
    _quiet()
    messages = {}
    if "trainer" in doors:
        trainer = quiet_trainer(strategy=name, devices=2, max_epochs=2)
        try:
            trainer.fit(
                Regression(), loader(regression_data(16), batch_size=4), ckpt_path=f"{folder}/trainer/c.ckpt"
            )
        except UnsafeCheckpointError as error:
            messages["trainer"] = str(error)
    if "accelerator" in doors:
        accelerator = dt.Accelerator(accelerator="cpu", strategy=name, devices=2)
        model = Net()
        model, _optimizer = accelerator.prepare(model, torch.optim.Adam(model.parameters(), lr=LR))
        try:
            accelerator.load_state(f"{folder}/accelerator")
        except UnsafeCheckpointError as error:
            messages["accelerator"] = str(error)
    return messages


def _assert_refused(results: list[dict[str, str]], marker: Path, doors: tuple[str, ...]) -> None:
    assert not marker.exists()
    opt_outs = {
        "trainer": "Trainer.fit(..., ckpt_path=..., weights_only=False)",
        "accelerator": "load_kwargs={'weights_only': False}",
    }
    for messages in results:  # every rank refused, none hung in a collective
        for door in doors:
            assert "safe loading refuses" in messages[door] and opt_outs[door] in messages[door]


BOTH = ("trainer", "accelerator")


@pytest.mark.multiprocess
def test_fsdp_loads_through_both_doors_refuse_planted_metadata(tmp_path: Path) -> None:
    run_processes(_save_sharded, 2, args=(str(tmp_path), "fsdp", BOTH), timeout=100)
    marker = tmp_path / "ran"
    for folder in (tmp_path / "trainer" / "c.ckpt", tmp_path / "accelerator" / "state.ckpt"):
        plant_in_dcp_metadata(folder, marker)
    _assert_refused(
        run_processes(_load_sharded, 2, args=(str(tmp_path), "fsdp", BOTH), timeout=100), marker, BOTH
    )


@pytest.mark.multiprocess
@pytest.mark.parametrize("how", ["metadata", "entry", "header"])
def test_consolidate_refuses_planted_fsdp_checkpoints(tmp_path: Path, how: str) -> None:
    run_processes(_save_sharded, 2, args=(str(tmp_path), "fsdp", ("accelerator",)), timeout=100)
    source, marker = tmp_path / "accelerator" / "state.ckpt", tmp_path / "ran"
    if how == "metadata":
        plant_in_dcp_metadata(source, marker)
    elif how == "entry":  # a non-tensor entry, which DCP's planner unpickles without restrictions
        add_dcp_bytes_entry(source, "planted", Payload(marker))
    else:  # drivetrain's own file of plain values
        plant_in_torch_file(source / "drivetrain_state.pt", marker)
    result = run_command([*DRIVETRAIN, "consolidate", str(source), str(tmp_path / "out.pt")], timeout=60)
    assert result.returncode == 2, result.stderr
    assert "safe loading refuses" in result.stderr and "--no-weights-only" in result.stderr, result.stderr
    assert not marker.exists() and not (tmp_path / "out.pt").exists()
    result = run_command(
        [*DRIVETRAIN, "consolidate", "--no-weights-only", str(source), str(tmp_path / "out.pt")], timeout=60
    )
    assert result.returncode == 0 and marker.exists()  # the explicit opt-out


needs_deepspeed = pytest.mark.skipif(not package_available("deepspeed"), reason="needs the deepspeed extra")


@pytest.mark.multiprocess
@pytest.mark.deepspeed
@needs_deepspeed
@pytest.mark.parametrize("door", ["trainer", "accelerator"])
def test_deepspeed_loads_refuse_planted_files(tmp_path: Path, door: str) -> None:
    doors = (door,)
    run_processes(_save_sharded, 2, args=(str(tmp_path), "deepspeed_stage_2", doors), timeout=100)
    marker = tmp_path / "ran"
    root = tmp_path / door / ("c.ckpt" if door == "trainer" else "state.ckpt")
    plant_in_torch_file(root / "checkpoint" / "mp_rank_00_model_states.pt", marker)
    results = run_processes(_load_sharded, 2, args=(str(tmp_path), "deepspeed_stage_2", doors), timeout=100)
    _assert_refused(results, marker, doors)
    if door == "accelerator":
        _assert_consolidate_refuses(root, tmp_path / "out.pt", marker)


@pytest.mark.multiprocess
@pytest.mark.deepspeed
@needs_deepspeed
def test_a_planted_deepspeed_optimizer_partition_is_refused(tmp_path: Path) -> None:
    """Rank 1's partition only: rank 1 refuses and rank 0 does not wait for it; zero_to_fp32 reads every partition."""
    doors = ("accelerator",)
    run_processes(_save_sharded, 2, args=(str(tmp_path), "deepspeed_stage_2", doors), timeout=100)
    marker, root = tmp_path / "ran", tmp_path / "accelerator" / "state.ckpt"
    plant_in_torch_file(root / "checkpoint" / "zero_pp_rank_1_mp_rank_00_optim_states.pt", marker)
    _assert_consolidate_refuses(root, tmp_path / "out.pt", marker)
    results = run_processes(_load_sharded, 2, args=(str(tmp_path), "deepspeed_stage_2", doors), timeout=100)
    _assert_refused(results, marker, doors)


def _assert_consolidate_refuses(source: Path, destination: Path, marker: Path) -> None:
    result = run_command([*DRIVETRAIN, "consolidate", str(source), str(destination)], timeout=100)
    assert result.returncode == 2 and "safe loading refuses" in result.stderr, result.stderr
    assert "--no-weights-only" in result.stderr
    assert not marker.exists() and not destination.exists()


def _stage0_model_file(rank: int, world_size: int, folder: str) -> Any:
    _quiet()
    from drivetrain.strategies import DeepSpeedStrategy

    strategy = dt.connect(accelerator="cpu", strategy=DeepSpeedStrategy(stage=0), devices=world_size)
    strategy.setup_environment()
    net = Net()
    model, _ = strategy.setup_module_and_optimizers(net, [torch.optim.SGD(net.parameters(), lr=LR)])
    strategy.save_state(f"{folder}/ckpt", {"model": model, "step": 1})


@pytest.mark.multiprocess
@pytest.mark.deepspeed
@needs_deepspeed
def test_consolidating_a_stage_0_deepspeed_checkpoint_is_safe(tmp_path: Path) -> None:
    run_processes(_stage0_model_file, 2, args=(str(tmp_path),), timeout=100)
    marker = tmp_path / "ran"
    plant_in_torch_file(tmp_path / "ckpt" / "checkpoint" / "mp_rank_00_model_states.pt", marker)
    result = run_command(
        [*DRIVETRAIN, "consolidate", str(tmp_path / "ckpt"), str(tmp_path / "out.pt")], timeout=180
    )
    assert result.returncode == 2 and "safe loading refuses" in result.stderr, result.stderr
    assert not marker.exists()
