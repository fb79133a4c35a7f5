"""Start the extra local ranks by running the user's command again, as torchrun would.

The current process becomes local rank 0; ranks 1…N-1 are new copies of the same command with
torchrun's variables set. The parent watches its children: when one dies, the others are
stopped at once, this process is interrupted with an error naming the dead rank, and the job
exits non-zero. Children die with their parent (``PR_SET_PDEATHSIG``), so none is orphaned. The
rendezvous store listens on loopback unless the job spans nodes.
"""

from __future__ import annotations

import atexit
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from drivetrain._utilities.log import get_logger
from drivetrain.strategies.launchers.launcher import Launcher, ProcessFailedError
from drivetrain.strategies.launchers.parent_death import set_parent_death_signal
from drivetrain.strategies.launchers.process_env import threads_per_process, worker_environment
from drivetrain.strategies.launchers.store import host_store, store_address
from drivetrain.strategies.preemption import Preempted, exit_code
from drivetrain.strategies.rank_failures import FailureRecord, read_failures, root_cause

if TYPE_CHECKING:
    from drivetrain.strategies.parallel import ParallelStrategy

_log = get_logger(__name__)  # launcher messages report failures: every rank that has one says so

#: Seconds the interrupted main thread gets to unwind before the process is ended forcibly.
INTERRUPT_GRACE_SECONDS = 10.0
#: The same, while the main thread waits inside the rendezvous (it cannot run the handler there).
JOINING_GRACE_SECONDS = 0.5
#: The signal that wakes this process's main thread when a child failed: a real-time signal nobody
#: else uses, so ``SIGUSR1``/``SIGUSR2`` stay the user's and the scheduler's (SLURM's requeue signal).
INTERRUPT_SIGNAL = signal.SIGRTMAX - 2 if hasattr(signal, "SIGRTMAX") else signal.SIGUSR2
#: Seconds children get, after this process finished, before they are stopped.
CHILD_EXIT_TIMEOUT_SECONDS = 120.0


class SubprocessScriptLauncher(Launcher):
    """Re-run ``sys.argv`` once per extra local rank; this process is local rank 0."""

    def __init__(self, strategy: ParallelStrategy) -> None:
        self._strategy = strategy
        self._children: list[tuple[int, subprocess.Popen[bytes]]] = []
        self._failure: ProcessFailedError | None = None
        self._store: dist.Store | None = None
        self._stopping = False
        self._exiting = False
        self._unwinding = False
        self._handled = False
        self._lock = threading.Lock()
        self._ended: list[tuple[int, int]] = []  # (rank, exit code) of children, in the order they ended
        self._namespace = ""
        self._started = False  # once per launcher: a one-process job has no children to tell it started

    def __getstate__(self) -> dict[str, Any]:
        # A copy (a pickled Accelerator) watches no processes: the children, the store and the lock stay here.
        state = self.__dict__.copy()
        state.update(_children=[], _store=None, _lock=None, _ended=[], _started=False)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    @property
    def is_interactive_compatible(self) -> bool:
        return False

    @property
    def children(self) -> list[tuple[int, subprocess.Popen[bytes]]]:
        """``(global rank, process)`` for each child started by this launcher."""
        return list(self._children)

    def launch(self, function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        environment = self._strategy.cluster_environment
        if not environment.creates_processes_externally and not self._started:
            self._start_children()
        try:
            return function(*args, **kwargs)
        except BaseException as error:
            if isinstance(error, Preempted):
                raise  # every rank stops together; the children end with the same code (see _at_exit)
            self._strategy.on_exception(error)
            if isinstance(error, ProcessFailedError):
                raise  # already names the rank that failed (the watcher interrupted us)
            self._unwinding = True
            cause = self._root_cause() if self._children else None
            self.stop_children()  # they cannot finish without this rank
            if cause is not None:
                raise cause from error
            raise

    def _root_cause(self) -> ProcessFailedError | None:
        """The error naming the rank whose failure ended the job; ``None`` when it is this rank.

        When this rank's error came from losing a peer, the peer's own story may still be on its
        way (its failure record is written before its connections close, but a rank killed by a
        signal writes none and is seen only once it has exited): wait for it, within a bound.
        """
        deadline = time.monotonic() + INTERRUPT_GRACE_SECONDS
        while True:
            cause = self._diagnose()
            settled = cause is not None and (cause[1] is None or not cause[1].secondary)
            if settled or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        if cause is None or cause[0] == self._strategy.global_rank:
            return None
        rank, record = cause
        process = dict(self._children).get(rank)
        if process is not None and record is not None:
            try:  # it is failing already; its exit code completes the report
                process.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        return _failure_error(rank, record, process)

    def _diagnose(self) -> tuple[int, FailureRecord | None] | None:
        """``(rank, record)`` of the root cause, from the failure records and the children's exits."""
        records = read_failures(self._store, self._namespace) if self._store is not None else []
        with self._lock:
            ended = list(self._ended)
        seen = {rank for rank, _ in ended}
        ended += [
            (rank, p.returncode) for rank, p in self._children if rank not in seen and p.poll() is not None
        ]
        return root_cause(records, ended)

    # -- starting ----------------------------------------------------------------------------
    def _start_children(self) -> None:
        self._started = True
        strategy = self._strategy
        environment = strategy.cluster_environment
        num_processes, num_nodes, node_rank = strategy.num_processes, strategy.num_nodes, strategy.node_rank
        port = environment.main_port
        spans_nodes = num_nodes > 1
        address = store_address(environment.main_address, spans_nodes=spans_nodes)
        if strategy.global_rank == 0:
            # Rank 0 hosts the rendezvous store (on loopback for one node, on a free port by default).
            store = host_store(
                environment.main_address,
                port,
                num_nodes * num_processes,
                strategy.timeout,
                spans_nodes=spans_nodes,
            )
            port = store.port
            self._namespace = environment.rendezvous_namespace()
            strategy._rendezvous_store = store
            self._store = store  # hosted until the children have exited (see _at_exit)
            if environment.main_port != port:
                set_main_port = getattr(environment, "set_main_port", None)
                if set_main_port is None:
                    raise RuntimeError(
                        f"{type(environment).__name__} gives no main port and cannot be told one."
                    )
                set_main_port(port)
        elif port == 0:
            raise ValueError(
                f"Node {node_rank} needs the address and port of node 0's rendezvous: set MASTER_ADDR and "
                f"MASTER_PORT to the same values on every node (and NODE_RANK to each node's rank)."
            )
        threads = threads_per_process(num_processes)
        torch.set_num_threads(threads)
        # A one-process job re-runs nothing, so it may come from anywhere (a notebook, `python -c`).
        command = script_command() if num_processes > 1 else []
        for local_rank in range(1, num_processes):
            child_env = {
                **os.environ,
                "OMP_NUM_THREADS": str(threads),
                **worker_environment(
                    local_rank=local_rank,
                    node_rank=node_rank,
                    num_processes=num_processes,
                    num_nodes=num_nodes,
                    main_address=address,
                    main_port=port,
                ),
            }
            # Children die with this process, however it ends (kill -9 included): no orphans.
            process = subprocess.Popen(command, env=child_env, preexec_fn=set_parent_death_signal)
            rank = node_rank * num_processes + local_rank
            self._children.append((rank, process))
            threading.Thread(
                target=self._watch, args=(rank, process), daemon=True, name=f"drivetrain-watch-rank-{rank}"
            ).start()
        if threading.current_thread() is threading.main_thread():
            signal.signal(INTERRUPT_SIGNAL, self._raise_failure)
        atexit.register(self._at_exit)

    # -- watching ----------------------------------------------------------------------------
    def _watch(self, rank: int, process: subprocess.Popen[bytes]) -> None:
        code = process.wait()
        with self._lock:
            self._ended.append((rank, code))
        if self._preempted(code):
            return
        # A child that ends well after the job's process group formed has finished its work. One
        # that ends, even with code 0, before ever joining a group (it ran another path of the
        # script, or the command re-run was not the script) leaves rank 0 waiting for it until
        # the rendezvous times out: a failure, reported now.
        joined = getattr(self._strategy, "_groups_formed", 1) > 0
        if code == 0 and joined:
            return
        with self._lock:
            if self._stopping or self._failure is not None:
                return
        if code == 0:
            failure = ProcessFailedError(
                f"{_describe_exit(rank, process.pid, code)} before joining the job's process group: every rank "
                f"must reach the same setup (Trainer.fit, Accelerator()), and rank {rank} ran "
                f"`{' '.join(script_command_of(process))}`",
                rank=rank,
                exit_code=code,
            )
        else:
            # The first child to die may only have lost a peer that is failing more slowly.
            cause_rank, record = self._diagnose() or (rank, None)
            failure = _failure_error(cause_rank, record, dict(self._children).get(cause_rank))
        with self._lock:
            if self._stopping or self._failure is not None:
                return
            # Reported while the lock is held: _at_exit, which ends the process with os._exit, takes
            # the lock first, so the report of a failure it finds set is never cut off midway.
            self._failure = failure
            _log.error(f"[drivetrain] {failure}; stopping the other ranks.", main_process_only=False)
            interrupt = not self._exiting and not self._unwinding
        self.stop_children()
        # At exit, _at_exit reports the failure itself; while unwinding, launch() reports it.
        if interrupt:
            self._interrupt_main_thread()

    def _preempted(self, code: int) -> bool:
        """Whether a child's exit ``code`` is the preemption stop this rank makes too (not a failure)."""
        watch = self._strategy.preemption
        return (
            watch is not None
            and watch.stopping
            and watch.signum is not None
            and code == exit_code(watch.signum)
        )

    def _interrupt_main_thread(self) -> None:
        # The main thread is probably blocked in a collective with the dead rank. A signal wakes it
        # into our handler, which raises ProcessFailedError; if it cannot unwind in time, exit.
        try:
            signal.pthread_kill(threading.main_thread().ident or 0, INTERRUPT_SIGNAL)
        except (ValueError, OSError):
            pass
        # Waiting in the rendezvous, the main thread runs no handler until every rank arrived (never,
        # now) and has nothing of the user's to unwind: it gets a moment, not the whole grace.
        joining = getattr(self._strategy, "_joining", False)
        grace = JOINING_GRACE_SECONDS if joining else INTERRUPT_GRACE_SECONDS
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            if self._handled:
                return
            time.sleep(0.05)
        if joining:
            reason = "was waiting in the rendezvous for ranks that will not come"
        else:
            reason = f"did not stop within {grace:.0f} s after {self._failure}"
        _log.error(
            f"[drivetrain] rank {self._strategy.global_rank} {reason}; exiting.", main_process_only=False
        )
        os._exit(1)

    def _raise_failure(self, signum: int, frame: Any) -> None:
        self._handled = True
        if self._failure is not None and not self._exiting:  # not inside _at_exit, which reports it
            raise self._failure

    # -- stopping ----------------------------------------------------------------------------
    def stop_children(self, grace_seconds: float = 3.0) -> None:
        """Terminate every child that is still running (SIGTERM, then SIGKILL after ``grace_seconds``)."""
        self._stopping = True
        running = [p for _, p in self._children if p.poll() is None]
        for process in running:
            process.terminate()
        deadline = time.monotonic() + grace_seconds
        for process in running:
            try:
                process.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

    def _at_exit(self) -> None:
        with self._lock:  # a watcher that decided to interrupt the main thread decided before this
            self._exiting = True
        if self._strategy.failure is not None and not self._stopping:
            # This rank leaves with an uncaught error (launch() handles those it sees). Name the root
            # cause first: the error may only be a broken connection to a child that failed first,
            # whose report the watcher has not made yet (stopping the children silences it). Then
            # stop them: they cannot finish without this rank, and may sit in a collective whose
            # connections stay open as long as this process lives.
            cause = self._root_cause()
            with self._lock:
                report = cause is not None and self._failure is None
                if report:
                    self._failure = cause
            if report:
                _log.error(f"[drivetrain] {cause}; stopping the other ranks.", main_process_only=False)
            self.stop_children()
        # This process is done. Leaving the process group releases children that still wait on rank 0.
        if dist.is_initialized():
            try:
                dist.destroy_process_group()
            except Exception:  # exit anyway; the group dies with the process
                pass
        deadline = time.monotonic() + CHILD_EXIT_TIMEOUT_SECONDS
        for rank, process in self._children:
            try:
                process.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _log.error(
                    f"[drivetrain] rank {rank} (pid {process.pid}) was still running "
                    f"{CHILD_EXIT_TIMEOUT_SECONDS:.0f} s after rank 0 finished; stopping it.",
                    main_process_only=False,
                )
                self.stop_children()
                os._exit(1)
        failed = [
            (rank, p.returncode)
            for rank, p in self._children
            if p.returncode not in (0, None) and not self._preempted(p.returncode)
        ]
        if failed and not self._stopping:
            for rank, code in failed:
                _log.error(f"[drivetrain] {_describe_exit(rank, None, code)}.", main_process_only=False)
        if failed or self._failure is not None:
            with self._lock:  # a watcher still writing its report finishes it first
                sys.stderr.flush()
                os._exit(1)


def script_command() -> list[str]:
    """The command that started this process, suitable for starting it again."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if spec is not None and spec.name and spec.name != "__main__":  # python -m package.module
        module = spec.name[: -len(".__main__")] if spec.name.endswith(".__main__") else spec.name
        return [sys.executable, "-m", module, *sys.argv[1:]]
    script = sys.argv[0] if sys.argv else ""
    if not script or script == "-c" or not os.path.exists(script):
        raise RuntimeError(
            "Cannot start more processes by re-running this program: it was not started from a script file "
            "(interactive session, notebook or `python -c`). Use strategy='ddp_notebook' (fork) or "
            "'ddp_spawn' with a function to run, or start the job with `drivetrain launch`."
        )
    return [sys.executable, os.path.abspath(script), *sys.argv[1:]]


def script_command_of(process: subprocess.Popen[bytes]) -> list[str]:
    """The command a child runs, as text."""
    arguments = process.args
    if isinstance(arguments, (str, bytes, os.PathLike)):
        return [os.fsdecode(arguments)]
    return [os.fsdecode(argument) for argument in arguments]


def _failure_error(
    rank: int, record: FailureRecord | None, process: subprocess.Popen[bytes] | None
) -> ProcessFailedError:
    pid = process.pid if process is not None else (record.pid if record is not None else None)
    code = process.poll() if process is not None else None
    if code is None:
        text = record.describe() if record is not None else f"rank {rank} failed"
    else:
        text = _describe_exit(rank, pid, code) + (f" after {record.summary}" if record is not None else "")
    return ProcessFailedError(text, rank=rank, exit_code=code)


def _describe_exit(rank: int, pid: int | None, code: int) -> str:
    where = f"rank {rank}" + (f" (pid {pid})" if pid is not None else "")
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"{where} was killed by {name}"
    return f"{where} exited with code {code}"
