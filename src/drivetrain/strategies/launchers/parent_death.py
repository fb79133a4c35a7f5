"""Ranks die with the launcher that started them, so a killed launcher leaves no orphans training on.

On Linux the kernel does it (``PR_SET_PDEATHSIG``): the rank is killed the moment its parent
ends, however the parent ends (``kill -9`` included), at no cost while it lives. Elsewhere a
daemon thread checks the parent every half second. Either way a rank whose parent is already
gone when it asks exits at once.
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


def die_with_parent(parent_pid: int) -> None:
    """End this process when ``parent_pid`` (its parent when it was started) ends.

    Args:
        parent_pid: the launcher's pid as the launcher itself saw it. If this process already
            has another parent, the launcher is gone and this process exits now (status 1).
    """
    armed = set_parent_death_signal()
    if os.getppid() != parent_pid:
        _orphaned(parent_pid)
    if not armed:
        threading.Thread(
            target=_watch_parent, args=(parent_pid,), daemon=True, name="drivetrain-parent-watch"
        ).start()


def _watch_parent(parent_pid: int) -> None:
    while os.getppid() == parent_pid:
        time.sleep(POLL_SECONDS)
    _orphaned(parent_pid)


def _orphaned(parent_pid: int) -> None:
    os.write(
        2, f"[drivetrain] the launcher (pid {parent_pid}) is gone; rank {os.getpid()} stops too.\n".encode()
    )
    os._exit(1)
