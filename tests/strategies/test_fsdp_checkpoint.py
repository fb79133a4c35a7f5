"""FSDP checkpoints in 2-process gloo jobs: sharded and full save/load, resume, consolidation.

Resuming must reproduce the uninterrupted run exactly (bit for bit) on CPU, including Adam's
state and a ``Linear(64, 1)`` head with fewer rows than ranks.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import drivetrain as dt
from drivetrain.strategies import FSDPStrategy
from drivetrain.strategies.consolidate import checkpoint_kind
from drivetrain.strategies.fsdp import consolidate_checkpoint
from helpers.multiprocess import run_processes
from helpers.sharded import LR, Net, batches, loss_of, numel, shard

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
