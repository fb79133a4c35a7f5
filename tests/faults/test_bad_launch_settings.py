"""Launcher variables that cannot make a job are an error within seconds, not a hang or a silently smaller job."""

from __future__ import annotations

import time

import pytest

from trainer.trainer_models import Regression, loader, quiet_trainer

pytestmark = pytest.mark.faults

CASES = [
    (
        {"LOCAL_RANK": "1"},
        r"LOCAL_RANK=1 is set, so this process looks started by a launcher, but WORLD_SIZE is not.*leftover",
    ),
    (
        {"LOCAL_RANK": "3", "RANK": "3", "WORLD_SIZE": "4"},
        r"LOCAL_RANK=3 is out of range for devices=2",
    ),
    (
        {"LOCAL_RANK": "0", "RANK": "0", "WORLD_SIZE": "4"},
        r"WORLD_SIZE=4 but devices=2 and num_nodes=1 make 2 processes",
    ),
    (
        {"LOCAL_RANK": "1", "RANK": "1", "WORLD_SIZE": "2"},
        r"RANK=1 of WORLD_SIZE=2 must find rank 0's rendezvous, but MASTER_PORT is not set",
    ),
    (
        {
            "LOCAL_RANK": "1",
            "RANK": "1",
            "WORLD_SIZE": "2",
            "MASTER_ADDR": "no-such-host.invalid",
            "MASTER_PORT": "29555",
        },
        r"MASTER_ADDR='no-such-host.invalid' does not resolve to an address",
    ),
]


@pytest.mark.parametrize(("env", "match"), CASES)
def test_launcher_variables_that_cannot_make_the_job_are_explained(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], match: str
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    started = time.monotonic()
    with pytest.raises(ValueError, match=match):
        quiet_trainer(strategy="ddp", devices=2).fit(Regression(), loader())
    assert time.monotonic() - started < 20
