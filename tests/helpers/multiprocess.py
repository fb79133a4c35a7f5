"""Run a function in N real processes joined by a gloo process group, with a hard timeout.

Every multi-process test goes through :func:`run_processes`:

* rendezvous without port races: the parent binds a TCP store on port 0 and the ranks join it;
* a failing rank's traceback comes back labelled with its rank;
* a hang fails the test after ``timeout`` seconds, naming the ranks still running, and every
  process is killed;
* the process group is always destroyed and no process outlives the call.

Processes are forked (the test process already imported torch, so start-up is cheap); the
function may be a closure or a local function.
"""

from __future__ import annotations

import datetime
import importlib
import multiprocessing
import os
import pickle
import sys
import time
import traceback
import warnings
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from drivetrain.utils import current


class RankFailed(AssertionError):
    """A rank raised; the message holds its labelled traceback."""


def import_before_fork() -> None:
    """Import ``torch._dynamo`` here, once, instead of in every forked rank.

    A forked rank inherits this process's modules, and the first DDP or FSDP wrap in a process
    imports ``torch._dynamo`` (2-6 s idle, ~8 s at a load of 12 on 2 cores): paid once per test
    session here instead of in both ranks of every job. The import starts no thread, so forking
    afterwards stays safe; its import-time warnings are the ranks' business, not this process's.
    """
    if "torch._dynamo" not in sys.modules:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            importlib.import_module("torch._dynamo")


def run_processes(
    function: Callable[..., Any],
    world_size: int = 2,
    *,
    timeout: float = 60.0,
    args: tuple[Any, ...] = (),
    process_group: bool = True,
    env: dict[str, str] | None = None,
    threads: int = 1,
) -> list[Any]:
    """Call ``function(rank, world_size, *args)`` in ``world_size`` processes; return each rank's result.

    Args:
        process_group: initialise the default gloo process group in each rank first.
        env: extra environment variables for the ranks (torchrun's are set already).
        threads: torch intra-op threads per rank (1 keeps 2 ranks from fighting over 2 cores).
    """
    import_before_fork()
    context = multiprocessing.get_context("fork")
    queue = context.SimpleQueue()
    # The store is made after the ranks are forked and its port sent to them: a rank forked while
    # the store's server thread held one of its locks inherited the lock held, and (now and then,
    # with 4 ranks) never got through its own TCPStore client's constructor.
    ports = context.SimpleQueue()
    store: Any = None
    processes = [
        context.Process(
            target=_rank_main,
            args=(
                rank,
                world_size,
                ports,
                function,
                args,
                queue,
                process_group,
                env or {},
                threads,
                timeout,
            ),
            name=f"test-rank-{rank}",
            daemon=True,
        )
        for rank in range(world_size)
    ]
    results: dict[int, Any] = {}
    failures: dict[int, str] = {}
    deadline = time.monotonic() + timeout
    try:
        for process in processes:
            process.start()
        store = dist.TCPStore(
            "127.0.0.1",
            0,
            world_size,
            is_master=True,
            wait_for_workers=False,
            timeout=datetime.timedelta(seconds=timeout),
        )
        for _ in processes:
            ports.put(store.port)
        while len(results) + len(failures) < world_size:
            while not queue.empty():
                kind, rank, payload = queue.get()
                (results if kind == "ok" else failures)[rank] = payload
            if failures:
                # One rank failed: the others may be stuck waiting for it, or failing for their own
                # reason a moment later (a peer that crashed explains a "connection closed by peer").
                _collect_for_a_moment(queue, processes, results, failures, seconds=2.0)
                break
            dead = [
                r
                for r, p in enumerate(processes)
                if p.exitcode is not None and r not in results and r not in failures
            ]
            if dead:
                time.sleep(0.2)  # let a last message arrive before calling the death silent
                while not queue.empty():
                    kind, rank, payload = queue.get()
                    (results if kind == "ok" else failures)[rank] = payload
                for rank in dead:
                    if rank not in results and rank not in failures:
                        failures[rank] = f"exited with code {processes[rank].exitcode} without reporting"
                break
            if time.monotonic() > deadline:
                running = [r for r in range(world_size) if r not in results]
                raise TimeoutError(f"ranks {running} did not finish within {timeout:.0f} s (hang?)")
            time.sleep(0.01)
    finally:
        for process in processes:
            if process.is_alive():
                process.kill()
            process.join(5)
        del store
    if failures:
        first = min(failures)
        others = "".join(f"\n--- rank {r} ---\n{failures[r]}" for r in sorted(failures) if r != first)
        raise RankFailed(f"rank {first} failed:\n{failures[first]}{others}")
    return [pickle.loads(results[rank]) for rank in range(world_size)]


def _collect_for_a_moment(
    queue: Any, processes: list[Any], results: dict[int, Any], failures: dict[int, str], seconds: float
) -> None:
    """Take the reports of the other ranks that arrive within ``seconds``; name the ones that died silently."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and len(results) + len(failures) < len(processes):
        while not queue.empty():
            kind, rank, payload = queue.get()
            (results if kind == "ok" else failures)[rank] = payload
        if all(
            p.exitcode is not None for r, p in enumerate(processes) if r not in results and r not in failures
        ):
            break
        time.sleep(0.01)
    while not queue.empty():
        kind, rank, payload = queue.get()
        (results if kind == "ok" else failures)[rank] = payload
    for rank, process in enumerate(processes):
        if rank not in results and rank not in failures and process.exitcode not in (None, 0):
            failures[rank] = f"exited with code {process.exitcode} without reporting"


def _rank_main(
    rank: int,
    world_size: int,
    ports: Any,
    function: Callable[..., Any],
    args: tuple[Any, ...],
    queue: Any,
    process_group: bool,
    env: dict[str, str],
    threads: int,
    timeout: float,
) -> None:
    port = ports.get()
    # A rank starts as a fresh process would: an Accelerator an earlier test made in the pytest process,
    # inherited through fork, is not this rank's current one (PartialState() would view its 1 process).
    current._owners.clear()
    os.environ.update(
        {
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": str(world_size),
            "LOCAL_WORLD_SIZE": str(world_size),
            "NODE_RANK": "0",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "OMP_NUM_THREADS": str(threads),
            **env,
        }
    )
    torch.set_num_threads(threads)
    try:
        if process_group:
            store = dist.TCPStore(
                "127.0.0.1", port, world_size, is_master=False, timeout=datetime.timedelta(seconds=timeout)
            )
            dist.init_process_group(
                "gloo",
                store=store,
                rank=rank,
                world_size=world_size,
                timeout=datetime.timedelta(seconds=timeout),
            )
        result = function(rank, world_size, *args)
        # Plain pickle bytes: torch's queue pickler shares tensors through memory that dies with this process.
        queue.put(("ok", rank, pickle.dumps(result)))
    except BaseException:
        queue.put(("error", rank, traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
