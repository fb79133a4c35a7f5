"""``notebook_launcher``'s rendezvous: bound by the launcher before any process starts, so no other
program can take its port in between (the ports here are real sockets)."""

from __future__ import annotations

import os
import signal
import socket
from pathlib import Path

import pytest
import torch

import drivetrain as dt


def _reach_then_train(directory: str) -> None:
    """Connect to MASTER_PORT before any Accelerator exists on this rank, then train a collective."""
    import os

    # Refused at once if nothing listens yet: the port must already be held for the job, by the launcher.
    with socket.create_connection((os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])), timeout=60):
        pass
    accelerator = dt.Accelerator(cpu=True)
    total = accelerator.reduce(torch.tensor([accelerator.process_index + 1.0])).item()
    (Path(directory) / f"rank{accelerator.process_index}").write_text(f"{os.environ['MASTER_PORT']} {total}")


@pytest.mark.multiprocess
def test_the_rendezvous_port_is_bound_before_the_processes_start(tmp_path: Path) -> None:
    # Another program listening on ports of its own does not disturb the launcher's choice.
    squatters = [socket.create_server(("127.0.0.1", 0)) for _ in range(3)]
    taken = {squatter.getsockname()[1] for squatter in squatters}
    try:
        dt.notebook_launcher(_reach_then_train, (str(tmp_path),), num_processes=2)
    finally:
        for squatter in squatters:
            squatter.close()
    lines = sorted(path.read_text() for path in tmp_path.iterdir())
    assert len(lines) == 2 and lines[0].split()[0] == lines[1].split()[0]
    assert [line.split()[1] for line in lines] == ["3.0", "3.0"]
    assert int(lines[0].split()[0]) not in taken


def _never_runs(directory: str) -> None:
    raise AssertionError("no process may start when the rendezvous cannot be hosted")


def test_a_taken_use_port_is_a_clear_error() -> None:
    with socket.create_server(("127.0.0.1", 0)) as squatter:
        port = squatter.getsockname()[1]
        with pytest.raises(
            ValueError, match=rf"use_port={port}\) cannot listen on port {port}.*Pass a free port"
        ):
            dt.notebook_launcher(_never_runs, ("x",), num_processes=2, use_port=port)


@pytest.mark.parametrize("port", ["http", 0, 70000, True])
def test_use_port_must_be_a_tcp_port(port: object) -> None:
    with pytest.raises(ValueError, match=r"use_port must be a TCP port between 1 and 65535"):
        dt.notebook_launcher(_never_runs, ("x",), num_processes=2, use_port=port)  # type: ignore[arg-type]


def test_a_function_name_or_bare_argument_is_refused_before_any_process_starts() -> None:
    # Both used to start two processes that each failed ("'str' object is not callable", "argument
    # after * must be an iterable"), reported as a ProcessRaisedException from rank 0.
    with pytest.raises(TypeError, match=r"needs the training function itself, got str \('train'\)"):
        dt.notebook_launcher("train", num_processes=2)  # type: ignore[arg-type]
    with pytest.raises(
        TypeError, match=r"as a tuple, got float \(2\.0\)\. For one argument write args=\(2\.0,\)\."
    ):
        dt.notebook_launcher(_never_runs, 2.0, num_processes=2)  # type: ignore[arg-type]


def _fail_once_then_train(directory: str) -> None:
    """Rank 1 fails in the first attempt; the elastic agent restarts both, and the second attempt trains."""
    import os

    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    if attempt == 0 and os.environ["RANK"] == "1":
        raise RuntimeError("rank 1 fails in the first attempt")
    accelerator = dt.Accelerator(cpu=True)
    total = accelerator.reduce(torch.tensor([accelerator.process_index + 1.0])).item()
    # A newly started process's handlers: the agent's, inherited through its fork, kept a worker
    # blocked in the rendezvous from dying of the agent's SIGTERM (the restart waited 30 s for SIGKILL).
    fresh = [signal.getsignal(s) == signal.SIG_DFL for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)]
    fresh.append(signal.getsignal(signal.SIGINT) is signal.default_int_handler)
    (Path(directory) / f"rank{accelerator.process_index}").write_text(f"{attempt} {total} {all(fresh)}")


@pytest.mark.multiprocess
@pytest.mark.timeout(240)
def test_accelerates_elastic_options_run_under_torchs_agent(tmp_path: Path) -> None:
    signals = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)
    handlers = [signal.getsignal(signum) for signum in signals]
    dt.notebook_launcher(
        _fail_once_then_train,
        (str(tmp_path),),
        num_processes=2,
        rdzv_backend="c10d",
        max_restarts=1,
        monitor_interval=0.2,
    )
    assert sorted(path.read_text() for path in tmp_path.iterdir()) == ["1 3.0 True", "1 3.0 True"]
    # torch's agent replaced them; the notebook gets its own back (Ctrl-C is a KeyboardInterrupt again).
    assert [signal.getsignal(signum) for signum in signals] == handlers
    assert "TORCHELASTIC_SIGNALS_TO_HANDLE" not in os.environ


def test_bad_elastic_options_are_explained() -> None:
    with pytest.raises(ValueError, match="max_restarts must be an int >= 0"):
        dt.notebook_launcher(_never_runs, ("x",), num_processes=2, max_restarts=-1)
    with pytest.raises(ValueError, match="monitor_interval must be a positive number"):
        dt.notebook_launcher(_never_runs, ("x",), num_processes=2, rdzv_backend="c10d", monitor_interval=0)
    with pytest.raises(TypeError, match=r"unexpected arguments \['max_restart'\]"):
        dt.notebook_launcher(_never_runs, ("x",), num_processes=2, max_restart=1)
