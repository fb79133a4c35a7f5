"""A single-node job's rendezvous store listens on loopback only, whoever hosts it; a multi-node one on every interface."""

from __future__ import annotations

import datetime
import ipaddress
import json
from collections.abc import Callable

import psutil
import pytest

from drivetrain.strategies.launchers.store import LOOPBACK, host_store, is_loopback
from faults.jobs import Job, launch, session_processes

__all__ = ["launch"]  # the fixture


def _listening(port: int, pids: list[int]) -> list[str]:
    found = []
    for pid in pids:
        try:
            connections = psutil.Process(pid).net_connections(kind="tcp")
        except psutil.Error:
            continue
        found += [c.laddr.ip for c in connections if c.status == psutil.CONN_LISTEN and c.laddr.port == port]
    return found


@pytest.mark.multiprocess
@pytest.mark.parametrize("mode", ["script", "ddp_spawn", "drivetrain launch"])
def test_a_single_node_job_rendezvous_on_loopback_only(launch: Callable[..., Job], mode: str) -> None:
    job = launch(mode, "trainer", "train")
    job.rank_pids()
    given = json.loads((job.directory / "rank1.rendezvous").read_text())
    assert given["MASTER_ADDR"] == LOOPBACK
    addresses = _listening(int(given["MASTER_PORT"]), session_processes(job.session))
    assert addresses, "nothing in the job listens on the port its ranks were given"
    assert all(ipaddress.ip_address(address).is_loopback for address in addresses), addresses


def test_host_store_binds_loopback_for_one_node_and_every_interface_for_several() -> None:
    timeout = datetime.timedelta(seconds=10)
    single = host_store(LOOPBACK, 0, 1, timeout, spans_nodes=False)
    several = host_store(LOOPBACK, 0, 1, timeout, spans_nodes=True)
    me = [psutil.Process().pid]
    assert _listening(single.port, me) == [LOOPBACK]
    assert not all(ipaddress.ip_address(a).is_loopback for a in _listening(several.port, me))
    single.set("key", "value")
    assert single.get("key") == b"value"
    assert [is_loopback(a) for a in ("127.0.0.1", "127.0.1.1", "::1", "localhost", "10.0.0.1", "node0")] == [
        True,
        True,
        True,
        True,
        False,
        False,
    ]
