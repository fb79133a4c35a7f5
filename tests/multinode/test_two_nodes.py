"""Real two-node jobs on one machine: two network namespaces joined by a veth pair.

Each "node" has its own network stack and address (192.0.2.1 and 192.0.2.2, a documentation
range that never leaves the machine), so the rendezvous and gloo traffic really cross a network
link. Needs root and iproute2; skipped otherwise.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers.scripts import clean_env

pytestmark = pytest.mark.multiprocess
JOB = Path(__file__).parent / "node_job.py"
ADDRESSES = ("192.0.2.1", "192.0.2.2")
PORT = 29611  # fixed: the namespaces are fresh, so nothing else can hold it


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=10)


@pytest.fixture
def two_nodes() -> Iterator[list[tuple[str, str]]]:
    """Two namespaces ``(name, interface)`` linked by a veth pair; removed afterwards."""
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root")
    tag = uuid.uuid4().hex[:6]
    nodes = [(f"dt{tag}n{i}", f"dt{tag}v{i}") for i in range(2)]
    try:
        for name, _ in nodes:
            _ip("netns", "add", name)
        _ip("link", "add", nodes[0][1], "type", "veth", "peer", "name", nodes[1][1])
        for (name, interface), address in zip(nodes, ADDRESSES):
            _ip("link", "set", interface, "netns", name)
            _ip("-n", name, "addr", "add", f"{address}/24", "dev", interface)
            _ip("-n", name, "link", "set", interface, "up")
            _ip("-n", name, "link", "set", "lo", "up")
    except (subprocess.CalledProcessError, FileNotFoundError) as error:
        for name, _ in nodes:
            subprocess.run(["ip", "netns", "del", name], capture_output=True)
        pytest.skip(f"cannot create network namespaces here: {error}")
    yield nodes
    for name, _ in nodes:
        subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=10)


def _run_nodes(
    nodes: list[tuple[str, str]], commands: list[list[str]], envs: list[dict[str, str]]
) -> list[str]:
    processes = [
        subprocess.Popen(
            ["ip", "netns", "exec", name, *command],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        for (name, _), command, env in zip(nodes, commands, envs)
    ]
    outputs = []
    try:
        for process in processes:
            stdout, stderr = process.communicate(timeout=120)
            assert process.returncode == 0, f"stdout:\n{stdout}\nstderr:\n{stderr}"
            outputs.append(stdout)
    finally:
        for process in processes:
            if process.poll() is None:
                os.killpg(process.pid, 9)
    return sorted(line for out in outputs for line in out.splitlines() if line.startswith("rank="))


def _node_env(interface: str, address: str, **extra: str) -> dict[str, str]:
    # gloo binds to the interface's address; without this it would resolve the hostname to 127.0.0.1.
    return clean_env(GLOO_SOCKET_IFNAME=interface, NODE_ADDRESS=address, OMP_NUM_THREADS="1", **extra)


def test_drivetrain_launch_across_two_nodes(two_nodes: list[tuple[str, str]]) -> None:
    commands = [
        [
            sys.executable,
            "-m",
            "drivetrain",
            "launch",
            "--nnodes",
            "2",
            "--node-rank",
            str(rank),
            "-n",
            "1",
            "--master-addr",
            ADDRESSES[0],
            "--master-port",
            str(PORT),
            str(JOB),
            "1",
        ]
        for rank in range(2)
    ]
    envs = [_node_env(interface, address) for (_, interface), address in zip(two_nodes, ADDRESSES)]
    assert _run_nodes(two_nodes, commands, envs) == [
        f"rank={rank} node={rank} world=2 sum=3.0 addresses=['192.0.2.1', '192.0.2.2']" for rank in range(2)
    ]


def test_the_script_launcher_across_two_nodes_with_two_processes_each(
    two_nodes: list[tuple[str, str]],
) -> None:
    commands = [[sys.executable, str(JOB), "2"] for _ in range(2)]
    envs = [
        _node_env(interface, address, MASTER_ADDR=ADDRESSES[0], MASTER_PORT=str(PORT), NODE_RANK=str(rank))
        for rank, ((_, interface), address) in enumerate(zip(two_nodes, ADDRESSES))
    ]
    assert _run_nodes(two_nodes, commands, envs) == [
        f"rank={rank} node={rank // 2} world=4 sum=10.0 addresses=['192.0.2.1', '192.0.2.2']"
        for rank in range(4)
    ]
