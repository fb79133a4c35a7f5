"""``drivetrain consolidate SRC DST`` on real FSDP and DeepSpeed checkpoints, run as a command."""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import pytest
import torch

import drivetrain as dt
from drivetrain._utilities.imports import package_available
from helpers.multiprocess import run_processes
from helpers.scripts import run_command
from helpers.sharded import LR, Net, batches, loss_of, shard

DRIVETRAIN = [sys.executable, "-m", "drivetrain"]


def _save_rank(rank: int, world_size: int, name: str, folder: str) -> dict[str, torch.Tensor]:
    warnings.filterwarnings(
        "ignore", message=r".* is deprecated\. Please use .*_single", category=FutureWarning
    )
    warnings.filterwarnings(
        "ignore", message=r"`torch\.jit\.script_method` is deprecated", category=DeprecationWarning
    )
    if name == "deepspeed_stage_0":  # no preset: plain data parallel under the DeepSpeed engine
        from drivetrain.strategies import DeepSpeedStrategy

        strategy = dt.connect(accelerator="cpu", strategy=DeepSpeedStrategy(stage=0), devices=world_size)
    else:
        strategy = dt.connect(accelerator="cpu", strategy=name, devices=world_size)
    strategy.setup_environment()
    torch.manual_seed(0)
    model = Net()
    model, [optimizer] = strategy.setup_module_and_optimizers(
        model, [torch.optim.Adam(model.parameters(), lr=LR)]
    )
    x, y = shard(batches(1)[0], rank)
    strategy.backward(loss_of(model(x), y), model)
    strategy.optimizer_step(optimizer, model=model)
    strategy.save_state(f"{folder}/ckpt", {"model": model, "optimizer": optimizer, "epoch": 1})
    return {k: v.detach().clone() for k, v in strategy.get_module_state_dict(model).items()}


@pytest.mark.multiprocess
@pytest.mark.parametrize(
    "name",
    [
        "fsdp",
        *(
            pytest.param(
                name,
                marks=[
                    pytest.mark.deepspeed,
                    pytest.mark.skipif(
                        not package_available("deepspeed"), reason="needs the deepspeed extra"
                    ),
                ],
            )
            for name in ("deepspeed_stage_0", "deepspeed_stage_3")
        ),
    ],
)
def test_consolidate_command_writes_a_single_device_file(tmp_path: Path, name: str) -> None:
    expected = run_processes(_save_rank, 2, args=(name, str(tmp_path)), timeout=120)[0]
    result = run_command(
        [*DRIVETRAIN, "consolidate", str(tmp_path / "ckpt"), str(tmp_path / "model.pt")], timeout=120
    )
    assert result.returncode == 0, result.stderr
    kind = "fsdp" if name == "fsdp" else "deepspeed"
    assert f"wrote the {kind} checkpoint" in result.stdout
    consolidated = torch.load(tmp_path / "model.pt", weights_only=True)
    assert consolidated["epoch"] == 1
    single = Net()
    single.load_state_dict(consolidated["model"])
    for key, tensor in expected.items():
        assert torch.equal(single.state_dict()[key], tensor)


def test_consolidate_command_explains_a_bad_source(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    result = run_command(
        [*DRIVETRAIN, "consolidate", str(tmp_path / "empty"), str(tmp_path / "out.pt")], timeout=60
    )
    assert result.returncode == 2
    assert "is not a sharded checkpoint drivetrain knows" in result.stderr
    assert not (tmp_path / "out.pt").exists()
