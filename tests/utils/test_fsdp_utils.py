"""Merging what ``Accelerator.save_state`` wrote under FSDP: ``drivetrain merge-weights <dir> out.pt``,
``merge_fsdp_weights`` and ``save_fsdp_model``, on a real 2-process FSDP run on CPUs."""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import pytest
import torch

import drivetrain as dt
from drivetrain.utils import merge_fsdp_weights, save_fsdp_model
from helpers.multiprocess import run_processes
from helpers.scripts import run_command
from helpers.sharded import LR, Net, batches, loss_of, shard


def _train_and_save(rank: int, world_size: int, folder: str) -> dict[str, torch.Tensor]:
    warnings.filterwarnings(
        "ignore", message=r".* is deprecated\. Please use .*_single", category=FutureWarning
    )
    accelerator = dt.Accelerator(strategy="fsdp", cpu=True)
    torch.manual_seed(0)
    model = Net()
    optimizer = torch.optim.Adam(model.parameters(), lr=LR)
    model, optimizer = accelerator.prepare(model, optimizer)
    x, y = shard(batches(1)[0], rank)
    accelerator.backward(loss_of(model(x), y))
    optimizer.step()
    accelerator.save_state(f"{folder}/state")
    save_fsdp_model(None, accelerator, model, f"{folder}/full")
    return {k: v.detach().clone() for k, v in accelerator.get_state_dict(model).items()}


@pytest.mark.multiprocess
@pytest.mark.timeout(240)
def test_a_save_state_folder_merges_into_one_process_weights(tmp_path: Path) -> None:
    expected = run_processes(_train_and_save, 2, args=(str(tmp_path),), timeout=150)[0]
    # The folder save_state was given, as accelerate merge-weights takes it.
    result = run_command(
        [
            sys.executable,
            "-m",
            "drivetrain",
            "merge-weights",
            str(tmp_path / "state"),
            str(tmp_path / "out.pt"),
        ],
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    merged = torch.load(tmp_path / "out.pt", weights_only=True)
    single = Net()
    single.load_state_dict(merged["state_dict"])  # the first model, under Lightning's name
    for key, tensor in expected.items():
        assert torch.equal(single.state_dict()[key], tensor), key

    written = merge_fsdp_weights(tmp_path / "state", tmp_path / "weights")
    assert written == tmp_path / "weights" / "model.safetensors"
    from safetensors.torch import load_file

    weights = load_file(written)
    assert weights.keys() == expected.keys() and all(torch.equal(weights[k], v) for k, v in expected.items())

    full = torch.load(tmp_path / "full" / "pytorch_model_fsdp.bin", weights_only=True)
    assert all(torch.equal(full[k], v) for k, v in expected.items())


def test_a_folder_with_a_single_file_says_it_is_consolidated_already(tmp_path: Path) -> None:
    (tmp_path / "state").mkdir()
    torch.save({"model_0": {}}, tmp_path / "state" / "state.ckpt")
    result = run_command(
        [
            sys.executable,
            "-m",
            "drivetrain",
            "merge-weights",
            str(tmp_path / "state"),
            str(tmp_path / "out.pt"),
        ],
        timeout=60,
    )
    assert result.returncode == 2
    assert "state.ckpt is a single file, already consolidated" in result.stderr


def test_save_fsdp_model_refuses_what_it_cannot_write(tmp_path: Path) -> None:
    accelerator = dt.Accelerator(cpu=True)
    model = accelerator.prepare(torch.nn.Linear(2, 2))

    class ShardedPlugin:
        state_dict_type = "SHARDED_STATE_DICT"

    with pytest.raises(ValueError, match=r"accelerator\.save_state"):
        save_fsdp_model(ShardedPlugin(), accelerator, model, tmp_path)
    with pytest.raises(ValueError, match="adapter_only=True"):
        save_fsdp_model(None, accelerator, model, tmp_path, adapter_only=True)
