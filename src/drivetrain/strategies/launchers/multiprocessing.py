"""Start all local ranks with ``torch.multiprocessing`` (spawn, fork or forkserver) and run a function.

The parent is not a rank: it hosts the rendezvous store (on loopback unless the job spans nodes),
waits for the ranks, and returns rank 0's result; the ranks die with it. It passes a scheduler's
stop signals (``SIGTERM``, ``SIGUSR1``, ``SIGUSR2``) on to the ranks, which may save and stop
(:mod:`drivetrain.strategies.preemption`); their :class:`Preempted` ends this process too. When a rank fails, ``torch.multiprocessing`` stops the others and we raise an error that
names the failed rank and carries its traceback.
"""

from __future__ import annotations

import atexit
import os
import pickle
import signal
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from drivetrain._utilities.apply import move_to_device
from drivetrain.strategies import rng
from drivetrain.strategies.launchers.launcher import Launcher, ProcessFailedError
from drivetrain.strategies.launchers.parent_death import die_with_parent
from drivetrain.strategies.launchers.process_env import threads_per_process, worker_environment
from drivetrain.strategies.launchers.store import check_resolvable, host_store, store_address
from drivetrain.strategies.preemption import Preempted
from drivetrain.strategies.rank_failures import read_failures, root_cause

if TYPE_CHECKING:
    from drivetrain.strategies.parallel import ParallelStrategy


class MultiprocessingLauncher(Launcher):
    """Run a function in ``num_processes`` new processes per node.

    Args:
        strategy: the strategy whose processes these are.
        start_method: ``"spawn"`` (pickles the function and its arguments), ``"fork"`` or ``"forkserver"``.
    """

    runs_in_spawned_processes = True

    def __init__(self, strategy: ParallelStrategy, start_method: str = "spawn") -> None:
        if start_method not in ("spawn", "fork", "forkserver"):
            raise ValueError(f"start_method={start_method!r}; use 'spawn', 'fork' or 'forkserver'.")
        if start_method not in mp.get_all_start_methods():
            raise ValueError(
                f"start_method={start_method!r} is not available on this platform "
                f"(available: {', '.join(mp.get_all_start_methods())}); use strategy='ddp_spawn'."
            )
        self._strategy = strategy
        self._start_method = start_method

    @property
    def is_interactive_compatible(self) -> bool:
        return self._start_method == "fork"

    def launch(self, function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        strategy = self._strategy
        environment = strategy.cluster_environment
        if environment.creates_processes_externally:
            raise RuntimeError(
                f"{type(environment).__name__} already started this job's processes, so "
                f"start_method={self._start_method!r} cannot start more. Use strategy='ddp' instead."
            )
        if self._start_method == "fork" and torch.cuda.is_available() and torch.cuda.is_initialized():
            raise RuntimeError(
                "CUDA was initialised in this process before forking, and forked processes cannot use it. "
                "Use strategy='ddp_spawn', or avoid touching CUDA before the launch."
            )
        if self._start_method != "fork":
            _check_picklable(function, args, kwargs)
        num_processes, num_nodes, node_rank = strategy.num_processes, strategy.num_nodes, strategy.node_rank
        port = environment.main_port
        store = None
        spans_nodes = num_nodes > 1
        if node_rank == 0:
            store = host_store(
                environment.main_address,
                port,
                num_nodes * num_processes,
                strategy.timeout,
                spans_nodes=spans_nodes,
            )
            port = store.port
        elif port == 0:
            raise ValueError("Set MASTER_ADDR and MASTER_PORT to node 0's rendezvous on every node.")
        else:
            check_resolvable(environment.main_address, type(environment).__name__)
        # Rank 0 pickles its result into a file: a pipe would block a large result until the parent
        # reads it, and torch's shared-memory tensor passing dies with the process that sent it.
        with tempfile.TemporaryDirectory(prefix="drivetrain-launch-") as scratch:
            result_path = os.path.join(scratch, "rank0-result.pkl")
            address = store_address(environment.main_address, spans_nodes=spans_nodes)
            try:
                self._run(function, args, kwargs, result_path, address, port, store)
            finally:
                # Hosted until every rank has finished, and not a moment longer, also when a rank failed:
                # the error's traceback keeps this frame, and a store left serving in this process (its
                # thread, its sockets) until the error is collected is inherited by every later fork.
                store = None
            if not os.path.exists(result_path):
                return None
            with open(result_path, "rb") as file:
                result = pickle.load(file)
        if isinstance(result, _Stopped):
            raise result.error  # the ranks stopped for a signal and saved: this program ends like them
        return result

    def _run(
        self,
        function: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        result_path: str,
        address: str,
        port: int,
        store: dist.Store | None,
    ) -> None:
        # Imported here: importing the façade (which reaches this launcher) loads no hardware plugin.

        strategy = self._strategy
        num_processes, num_nodes, node_rank = strategy.num_processes, strategy.num_nodes, strategy.node_rank
        # Pickled here with the standard pickler: torch's multiprocessing pickler would move CPU tensors
        # (the user's model) into shared memory, and every rank would then update the same weights.
        # Forked ranks copy the parent's memory instead and need no pickling at all.
        work = (strategy, function, args, kwargs)
        payload: bytes | tuple[Any, ...] = work if self._start_method == "fork" else pickle.dumps(work)
        process_context = mp.start_processes(
            _run_rank,
            args=(
                payload,
                result_path,
                node_rank,
                num_processes,
                num_nodes,
                address,
                port,
                threads_per_process(num_processes),
                os.getpid(),
                # Every rank starts with this process's generators (a seed set before the launch
                # holds in the ranks, as it does when the script is re-run); the device's start later.
                {k: v for k, v in rng.capture(strategy).items() if k != "device"},
            ),
            nprocs=num_processes,
            join=False,
            start_method=self._start_method,
        )
        try:
            with _forwarding_signals([process.pid for process in process_context.processes]):
                while not process_context.join():
                    pass
        except (mp.ProcessRaisedException, mp.ProcessExitedException) as error:
            failure = self._root_cause(process_context, error, store)
            del store  # see launch(): the traceback keeps this frame too
            raise failure from None

    def _root_cause(
        self,
        context: Any,
        error: mp.ProcessRaisedException | mp.ProcessExitedException,
        store: dist.Store | None,
    ) -> ProcessFailedError:
        """The error naming the rank whose failure ended the job, with its traceback when it raised.

        torch reports whichever failed process it noticed first; the ranks' failure records say
        which one started it (a rank that raised, not the peer that then lost it in a collective).
        """
        strategy = self._strategy
        first_rank = strategy.node_rank * strategy.num_processes
        records = read_failures(store, strategy.cluster_environment.rendezvous_namespace()) if store else []
        noticed = error.error_index
        order = [noticed, *(i for i in range(len(context.processes)) if i != noticed)]
        ended = [
            (first_rank + i, context.processes[i].exitcode)
            for i in order
            if context.processes[i].exitcode is not None
        ]
        cause = root_cause(records, ended)
        rank = cause[0] if cause is not None else first_rank + noticed
        index = rank - first_rank
        local = 0 <= index < len(context.processes)
        pid = context.processes[index].pid if local else (cause[1].pid if cause and cause[1] else None)
        where = f"rank {rank}" + (f" (pid {pid})" if pid is not None else "")
        trace = _error_file_trace(context.error_files[index]) if local else None
        if trace is None and cause is not None and cause[1] is not None:
            trace = f"\n{cause[1].traceback}"
        if trace is not None:
            return ProcessFailedError(f"{where} failed:{trace}", rank=rank)
        code = context.processes[index].exitcode if local else None
        return ProcessFailedError(f"{where} {_how(code)}", rank=rank, exit_code=code)


def _run_rank(
    local_rank: int,
    payload: bytes | tuple[Any, ...],
    result_path: str,
    node_rank: int,
    num_processes: int,
    num_nodes: int,
    main_address: str,
    main_port: int,
    threads: int,
    parent_pid: int,
    rng_states: dict[str, Any],
) -> None:
    die_with_parent(
        parent_pid, node_rank * num_processes + local_rank
    )  # a killed launcher must not leave its ranks running
    os.environ.update(
        worker_environment(
            local_rank=local_rank,
            node_rank=node_rank,
            num_processes=num_processes,
            num_nodes=num_nodes,
            main_address=main_address,
            main_port=main_port,
        )
    )
    os.environ["OMP_NUM_THREADS"] = str(threads)
    torch.set_num_threads(threads)
    strategy, function, args, kwargs = pickle.loads(payload) if isinstance(payload, bytes) else payload

    rng.restore(strategy, rng_states)
    # The parent hosts the store, so every rank (rank 0 included) joins it as a client.
    strategy._rendezvous_store = dist.TCPStore(
        main_address, main_port, num_nodes * num_processes, is_master=False, timeout=strategy.timeout
    )
    try:
        result = function(*args, **kwargs)
    except Preempted as stopped:
        result = _Stopped(stopped)  # every rank stopped together: a clean end, reported by the parent
    except BaseException as error:
        strategy.on_exception(error)  # recorded for the parent, and no collective on the way out
        raise
    if node_rank == 0 and local_rank == 0:
        with open(result_path, "wb") as file:
            pickle.dump(move_to_device(result, "cpu"), file)
    # The rank's work is done and reported. Leave the process group (a no-op if the function did).
    # A spawned rank then runs its exit handlers (trackers finish their runs there) and ends without
    # interpreter finalisation: daemon threads still inside torch's C++ code are killed there, which
    # aborts the rank ("terminate called without an active exception"). A forked rank holds copies
    # of the launching process's exit handlers, so it ends the ordinary way.
    strategy.leave_at_exit()
    if not isinstance(payload, bytes):
        return
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


class _Stopped:
    """Rank 0's result when the ranks stopped for a preemption signal (raised again in the parent)."""

    def __init__(self, error: Preempted) -> None:
        self.error = error


#: Signals the launching process passes on to its ranks: a scheduler's stop or requeue signal
#: reaches this process, while the ranks are the ones that can act on it (save, then exit).
FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2)


@contextmanager
def _forwarding_signals(ranks: list[int]) -> Iterator[None]:
    """Pass :data:`FORWARDED_SIGNALS` on to the ``ranks`` (pids) while they run (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def forward(signum: int, frame: Any) -> None:
        for pid in ranks:
            try:
                os.kill(pid, signum)
            except ProcessLookupError:
                pass

    previous = {signum: signal.signal(signum, forward) for signum in FORWARDED_SIGNALS}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)


def _error_file_trace(path: str) -> str | None:
    """The traceback torch's rank wrapper wrote to ``path`` when the rank raised (``None`` otherwise)."""
    try:
        if os.path.getsize(path) == 0:
            return None
        with open(path, "rb") as file:
            return f"\n{pickle.load(file)}"
    except (OSError, EOFError, pickle.UnpicklingError):
        return None


def _how(code: int | None) -> str:
    if code is None:
        return "failed"
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


def _check_picklable(function: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    for what, value in (("function", function), ("arguments", args), ("keyword arguments", kwargs)):
        try:
            pickle.dumps(value)
        except Exception as error:
            raise TypeError(
                f"The {what} to run in the new processes cannot be pickled, which start_method='spawn' needs: "
                f"{type(error).__name__}: {error}. Define functions and classes at module level (not inside "
                f"another function or in a notebook cell), or use strategy='ddp_fork' / 'ddp_notebook'."
            ) from None
