"""Ranks die with the launcher that started them, so a killed launcher leaves no orphans training on.

On Linux the kernel does it (``PR_SET_PDEATHSIG``): the rank is killed the moment its parent
ends, however the parent ends (``kill -9`` included), at no cost while it lives. Elsewhere a
daemon thread checks the parent every half second. Either way a rank whose parent is already
gone when it asks exits at once.

A launcher that does not say who it is (torchrun) is the parent this process had when drivetrain
was imported, not the parent when the rank sets up: a launcher killed
in between has been replaced by init by then. For the same reason a parent that is init (pid 1)
counts as gone, unless pid 1 may itself be a launcher (a container whose first process is
torchrun or a Python script: when it ends, the kernel ends the whole container anyway).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

#: How often the fallback watchdog (platforms without ``PR_SET_PDEATHSIG``) looks at the parent.
POLL_SECONDS = 0.5
_PR_SET_PDEATHSIG = 1


def set_parent_death_signal(sig: int = signal.SIGKILL) -> bool:
    """Ask Linux to send ``sig`` to this process when its parent ends; ``False`` where unsupported.

    Safe to call between ``fork`` and ``exec`` (a ``preexec_fn``): it only calls ``prctl``.
    """
    if not sys.platform.startswith("linux"):
        return False
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def die_with_parent(parent_pid: int, rank: int | None = None) -> None:
    """End this process when ``parent_pid`` (its parent when it was started) ends.

    Args:
        parent_pid: the launcher's pid as the launcher itself saw it (or the parent it had at start).
            If this process already has another parent, or its parent is init (pid 1) and init
            cannot be a launcher, the launcher is gone and this process exits now (status 1).
        rank: this process's global rank, for the message.
    """
    armed = set_parent_death_signal()
    if os.getppid() != parent_pid or (parent_pid == 1 and not _init_may_be_a_launcher()):
        _orphaned(parent_pid, rank)
    if not armed:
        threading.Thread(
            target=_watch_parent, args=(parent_pid, rank), daemon=True, name="drivetrain-parent-watch"
        ).start()


def _init_may_be_a_launcher() -> bool:
    """Whether pid 1 may be the launcher: a Python program (torchrun, drivetrain launch, a script) can be.

    Where pid 1's command line cannot be read on Linux it is given the benefit of the doubt; a
    system's init elsewhere (launchd) never launches ranks.
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        with open("/proc/1/cmdline", "rb") as file:
            arguments = file.read().split(b"\0")
    except OSError:
        return True
    program = os.path.basename(arguments[0]).decode(errors="replace")
    return program.startswith(("python", "torchrun", "pypy")) or any(
        b"torch.distributed" in argument or b"torchrun" in argument for argument in arguments[1:3]
    )


def _watch_parent(parent_pid: int, rank: int | None) -> None:
    while os.getppid() == parent_pid:
        time.sleep(POLL_SECONDS)
    _orphaned(parent_pid, rank)


def _orphaned(parent_pid: int, rank: int | None) -> None:
    who = f"rank {rank} (pid {os.getpid()})" if rank is not None else f"process {os.getpid()}"
    launcher = f"(pid {parent_pid})" if parent_pid != 1 else "(init, pid 1, has adopted this process)"
    os.write(2, f"[drivetrain] the launcher is gone {launcher}; {who} stops too.\n".encode())
    os._exit(1)
