"""Start all local ranks with ``torch.multiprocessing`` (spawn, fork or forkserver) and run a function.

The parent is not a rank: it hosts the rendezvous store, waits for the ranks, and returns rank 0's
result. When a rank fails, ``torch.multiprocessing`` stops the others and we raise an error that
names the failed rank and carries its traceback.
"""

from __future__ import annotations

import os
import pickle
import tempfile
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from drivetrain._utilities.apply import move_to_device
from drivetrain.strategies.launchers.launcher import Launcher, ProcessFailedError
from drivetrain.strategies.launchers.process_env import threads_per_process, worker_environment

if TYPE_CHECKING:
    from drivetrain.strategies.parallel import ParallelStrategy


class MultiprocessingLauncher(Launcher):
    """Run a function in ``num_processes`` new processes per node.

    Args:
        strategy: the strategy whose processes these are.
        start_method: ``"spawn"`` (pickles the function and its arguments), ``"fork"`` or ``"forkserver"``.
    """

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
        if node_rank == 0:
            store = dist.TCPStore(
                environment.main_address,
                port,
                num_nodes * num_processes,
                is_master=True,
                timeout=strategy.timeout,
                wait_for_workers=False,
            )
            port = store.port
        elif port == 0:
            raise ValueError("Set MASTER_ADDR and MASTER_PORT to node 0's rendezvous on every node.")
        # Rank 0 pickles its result into a file: a pipe would block a large result until the parent
        # reads it, and torch's shared-memory tensor passing dies with the process that sent it.
        with tempfile.TemporaryDirectory(prefix="drivetrain-launch-") as scratch:
            result_path = os.path.join(scratch, "rank0-result.pkl")
            self._run(function, args, kwargs, result_path, port)
            if not os.path.exists(result_path):
                return None
            with open(result_path, "rb") as file:
                result = pickle.load(file)
        del store  # hosted until every rank has finished
        return result

    def _run(
        self,
        function: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        result_path: str,
        port: int,
    ) -> None:
        strategy = self._strategy
        environment = strategy.cluster_environment
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
                environment.main_address,
                port,
                threads_per_process(num_processes),
            ),
            nprocs=num_processes,
            join=False,
            start_method=self._start_method,
        )
        try:
            while not process_context.join():
                pass
        except mp.ProcessRaisedException as error:
            # torch reports whichever failed rank it noticed first; when a rank raised and its peers
            # then failed in a collective, the earliest error file names the rank that started it.
            index, trace = _earliest_error(process_context.error_files) or (error.error_index, error.msg)
            rank = node_rank * num_processes + index
            pid = process_context.processes[index].pid
            raise ProcessFailedError(f"rank {rank} (pid {pid}) failed:\n{trace}", rank=rank) from None
        except mp.ProcessExitedException as error:
            rank = node_rank * num_processes + error.error_index
            how = (
                f"was killed by {error.signal_name}"
                if error.signal_name
                else f"exited with code {error.exit_code}"
            )
            raise ProcessFailedError(
                f"rank {rank} (pid {error.error_pid}) {how}", rank=rank, exit_code=error.exit_code
            ) from None


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
) -> None:
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
    # The parent hosts the store, so every rank (rank 0 included) joins it as a client.
    strategy._rendezvous_store = dist.TCPStore(
        main_address, main_port, num_nodes * num_processes, is_master=False, timeout=strategy.timeout
    )
    result = function(*args, **kwargs)
    if node_rank == 0 and local_rank == 0:
        with open(result_path, "wb") as file:
            pickle.dump(move_to_device(result, "cpu"), file)


def _earliest_error(error_files: list[str]) -> tuple[int, str] | None:
    """The local index and traceback of the rank whose error file was written first."""
    written = []
    for index, path in enumerate(error_files):
        try:
            if os.path.getsize(path) > 0:
                written.append((os.stat(path).st_mtime_ns, index, path))
        except OSError:
            continue
    if not written:
        return None
    _, index, path = min(written)
    with open(path, "rb") as file:
        return index, f"\n{pickle.load(file)}"


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
