"""The seeds' own extension examples (tests/testing/seed_plugins.py) pass the conformance kit.

The seed's ``XPUAccelerator`` runs on a stand-in ``xpulib`` with ``fake=True`` (its ``xpu`` devices
compute on the CPU). In CI the three examples pass the contract checks, and one run of whole
programs covers all of them at once: the registry preset ``ddp_custom_checkpoint_io`` (DDP with the
seed's custom checkpoint IO writing every checkpoint) on the seed's XPU, through both front doors on
two processes under ``drivetrain launch -n 2``, and ``python train.py fit --trainer.accelerator=xpu
--trainer.strategy=ddp_custom_checkpoint_io --trainer.devices=2``. Each example's own full run is in
``scripts/check-plugins``.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType

import pytest

from drivetrain.accelerators import AcceleratorRegistry
from drivetrain.testing import Report, Status, check_accelerator, check_checkpoint_io, check_strategy


@pytest.fixture
def seeds() -> ModuleType:
    """The seeds' module, with its names registered (again: each test starts from the built-in registries)."""
    with pytest.warns(UserWarning, match=r"XPUAccelerator replaces the built-in accelerator 'xpu'"):
        if "testing.seed_plugins" in sys.modules:
            return importlib.reload(sys.modules["testing.seed_plugins"])
        return importlib.import_module("testing.seed_plugins")


def _all_pass(report: Report) -> None:
    assert report.ok, report.table()
    assert all(row.status is Status.PASSED or row.reason for row in report), report.table()


def test_the_seed_xpu_accelerator_passes_the_contract(seeds: ModuleType) -> None:
    report = check_accelerator(seeds.XPUAccelerator, fake=True, stand_in=None, whole_programs=False)
    _all_pass(report)
    assert AcceleratorRegistry.entry("xpu").cls is seeds.XPUAccelerator
    assert report.row("accelerator: registered under a short name").passed
    # The seed's device keeps no generator of its own (its xpulib has none): justified, not failed.
    assert report.row("accelerator: random generators saved and restored").status is Status.NOT_APPLICABLE


def test_the_seed_strategy_and_checkpoint_io_pass_the_contract(seeds: ModuleType, tmp_path: Path) -> None:
    _all_pass(check_strategy(seeds.CustomDDPStrategy, whole_programs=False))
    _all_pass(
        check_strategy("ddp_custom_checkpoint_io", imports=["testing.seed_plugins"], whole_programs=False)
    )
    _all_pass(check_checkpoint_io(seeds.CustomCheckpointIO, tmp_path, whole_programs=False))


@pytest.mark.multiprocess
@pytest.mark.timeout(600)
def test_the_seed_preset_on_the_seed_xpu_runs_both_doors_on_two_processes(
    seeds: ModuleType, tmp_path: Path
) -> None:
    report = check_strategy(
        "ddp_custom_checkpoint_io",
        accelerator="xpu",
        fake=True,
        stand_in=None,
        imports=["testing.seed_plugins"],
        processes=[2],
        root=tmp_path,
    )
    _all_pass(report)
    assert report.row("Trainer, 2 processes: save, kill, resume bit-exactly").passed
    assert report.row("Accelerator, 2 processes: save_state, kill, load_state bit-exactly").passed
    assert report.row("2 processes: strategy='ddp_custom_checkpoint_io' in every process").passed
    cli = "CLI: python train.py fit --trainer.accelerator=xpu --trainer.strategy=ddp_custom_checkpoint_io --trainer.devices=2"
    assert report.row(cli).passed
    # The seed's checkpoint IO wrote the Trainer's checkpoints, which the resumed fit read back.
    assert sorted(p.name for p in (tmp_path / "strategy" / "2-process" / "trainer-killed").iterdir()) == [
        "epoch=0-step=3.ckpt",
        "epoch=1-step=6.ckpt",
    ]
