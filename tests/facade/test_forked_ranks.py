"""The test helper's forked ranks start as fresh processes, whatever the pytest process made before."""

from __future__ import annotations

import pytest

import drivetrain as dt
from drivetrain.facade import PartialState
from helpers.multiprocess import run_processes

TORCHRUN = {"TORCHELASTIC_RUN_ID": "fresh", "TORCHELASTIC_USE_AGENT_STORE": "True", "GROUP_RANK": "0"}


def _processes_seen(rank: int, world: int) -> int:
    return int(PartialState(cpu=True).num_processes)


@pytest.mark.multiprocess
def test_a_forked_rank_does_not_view_an_accelerator_the_parent_made() -> None:
    # Under pytest-xdist an earlier test on the worker may have left an Accelerator alive; the ranks
    # forked from it then saw its one process (test_accelerate_parity's state views failed so).
    parents = dt.Accelerator(cpu=True)
    assert run_processes(_processes_seen, 2, process_group=False, env=TORCHRUN, timeout=60) == [2, 2]
    assert parents.num_processes == 1
