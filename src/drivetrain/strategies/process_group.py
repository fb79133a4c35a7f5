"""How a :class:`~drivetrain.strategies.ParallelStrategy` meets its peers and leaves them.

* :func:`open_rendezvous_store`: the job's rendezvous store, hosted by rank 0 (or by torchrun's
  agent) and joined by every other rank, with the launch-setting errors users meet first.
* :func:`wait_for_peers_through_store`: a bounded barrier on that store, for leaving at exit.
* :func:`leave_at_exit_later`: scripts that never tear down (Accelerate-style ones rarely do)
  still leave the process group at interpreter exit, and an uncaught exception is recorded for
  the peers before this rank's connections close.
"""

from __future__ import annotations

import atexit
import datetime
import gc
import sys
import time
import weakref
from typing import TYPE_CHECKING, Any

import torch.distributed as dist

from drivetrain.strategies.launchers.store import check_resolvable, host_store, is_loopback

if TYPE_CHECKING:
    from drivetrain.plugins.environments.cluster_environment import ClusterEnvironment
    from drivetrain.strategies.parallel import ParallelStrategy

#: How long a rank leaving at interpreter exit waits for its peers to leave too.
EXIT_WAIT_SECONDS = 2.0
_crashed = False

_live: weakref.WeakSet[ParallelStrategy] = weakref.WeakSet()


def as_timedelta(timeout: datetime.timedelta | float) -> datetime.timedelta:
    """``timeout`` (a ``timedelta`` or seconds) as a positive ``timedelta``; ``TypeError``/``ValueError`` otherwise."""
    if isinstance(timeout, datetime.timedelta):
        seconds = timeout.total_seconds()
    elif isinstance(timeout, (int, float)) and not isinstance(timeout, bool):
        seconds = float(timeout)
    else:
        raise TypeError(f"timeout must be a datetime.timedelta or a number of seconds, got {timeout!r}.")
    if seconds <= 0:
        raise ValueError(f"timeout must be positive, got {timeout!r}.")
    return datetime.timedelta(seconds=seconds)


def open_rendezvous_store(
    environment: ClusterEnvironment,
    global_rank: int,
    world_size: int,
    num_nodes: int,
    timeout: datetime.timedelta,
) -> dist.Store:
    """Host (rank 0, unless torchrun's agent hosts it) or join the job's rendezvous store."""
    # Under torchrun every rank, rank 0 included, joins the store its agent already hosts.
    hosts = global_rank == 0 and not environment.uses_agent_store
    address = environment.main_address
    if environment.creates_processes_externally and world_size > 1 and environment.main_port == 0:
        raise ValueError(
            f"RANK={global_rank} of WORLD_SIZE={world_size} must find rank 0's rendezvous, but "
            f"MASTER_PORT is not set ({type(environment).__name__} gives no port), so the processes cannot "
            f"meet. Set MASTER_ADDR and MASTER_PORT to rank 0's host and a free port in every process, or "
            f"start the job with `drivetrain launch` or torchrun, which set them."
        )
    if not hosts:
        check_resolvable(address, type(environment).__name__)
        return dist.TCPStore(address, environment.main_port, None, is_master=False, timeout=timeout)
    # Loopback only when every rank connects through loopback anyway (one node).
    spans_nodes = num_nodes > 1 or not is_loopback(address)
    return host_store(address, environment.main_port, world_size, timeout, spans_nodes=spans_nodes)


def wait_for_peers_through_store(store: dist.Store | None, key: str, world_size: int, seconds: float) -> None:
    """A barrier on the rendezvous store that gives up after ``seconds`` (works on any backend)."""
    if store is None:
        return
    try:
        arrived = store.add(key, 1)
        deadline = time.monotonic() + seconds
        while arrived < world_size and time.monotonic() < deadline:
            time.sleep(0.005)
            arrived = store.add(key, 0)
    except Exception:  # the store's host is gone: nobody is left to wait for
        pass


def crashed() -> bool:
    """Whether an uncaught exception reached ``sys.excepthook`` in this process."""
    return _crashed


def leave_at_exit_later(strategy: ParallelStrategy) -> None:
    """Leave ``strategy``'s process group at interpreter exit, and note an uncaught exception first."""
    atexit.register(_leave_at_exit, weakref.ref(strategy))
    _watch_for_crashes(strategy)


def _leave_at_exit(reference: weakref.ref[ParallelStrategy]) -> None:
    # A process group or DDP reducer still alive when the interpreter finalises can abort the process
    # ("terminate called without an active exception"), so leave the group here. Peers are waited
    # for through the store, with a bound: a barrier with a dead peer would wait for the group's
    # full timeout on NCCL. After an uncaught exception nobody waits: the launcher reports it.
    strategy = reference()
    if strategy is not None:
        strategy.leave_at_exit()
        del strategy
    # Leaving takes the group out of torch's registry, but a DDP wrapper the program no longer
    # reaches (a reference cycle, say the model of a `main()` that returned) still holds it through
    # its reducer; without this collection the group is freed in the interpreter's finalisation,
    # where gloo's threads can abort the finished process (torch's PR 179291 describes the crash).
    gc.collect()


def _watch_for_crashes(strategy: ParallelStrategy) -> None:
    """Chain a ``sys.excepthook`` that notes an uncaught exception (installed once per process).

    The hook runs before the interpreter exits and closes this rank's connections, so the
    failure record it writes is in the store before any peer can notice this rank is gone.
    """
    _live.add(strategy)
    previous = sys.excepthook
    if getattr(previous, "_drivetrain", False):
        return

    def note_crash(kind: type[BaseException], error: BaseException, trace: Any) -> None:
        global _crashed
        _crashed = True
        for live in list(_live):
            live.on_exception(error)
        previous(kind, error, trace)

    note_crash._drivetrain = True  # type: ignore[attr-defined]
    sys.excepthook = note_crash
