"""What the collective checks cost per call, and what the stuck-collective watchdog costs per training step.

Every collective of a parallel strategy passes through ``ParallelStrategy._collective`` (a
failure check, and a note of which collective runs and from where, for the watchdog). A watchdog
thread wakes twice a second. Both are measured against the same operation without them, in the
same processes, interleaved round by round so that machine noise hits both alike:

* ``all_reduce``: ``strategy.all_reduce(t)`` against the bare ``torch.distributed`` call it wraps;
* ``ddp step``: a DDP training step of a small MLP with the watchdog running, and with it stopped.

Two CPU processes over gloo (the script starts the second one itself); rank 0 prints medians of
the main thread's CPU time and of wall time, per call and per step.

    python benchmarks/collective_overhead.py                  # 15 rounds
    python benchmarks/collective_overhead.py --rounds 25

Instruction counts are stable where timings are not: ``--instructions VARIANT`` runs one process
with a one-rank gloo group and makes 200 ``all_reduce`` calls inside ``math.fsum`` and 600 inside
``math.prod``, so under callgrind the difference of the two functions' inclusive counts, divided
by 400, is the cost of one call. ``wrapped`` is ``strategy.all_reduce``; ``unmonitored`` the same
method with ``_collective`` reduced to calling the operation (the checks' cost is the
difference); ``bare`` the ``torch.distributed`` call alone::

    for v in wrapped unmonitored bare; do
      valgrind --tool=callgrind --callgrind-out-file=cg.$v python benchmarks/collective_overhead.py --instructions $v
      callgrind_annotate --inclusive=yes cg.$v | grep -E "math_(fsum|prod) "
    done
"""

from __future__ import annotations

import argparse
import datetime
import math
import os
import statistics
import time
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn

import drivetrain as dt
from drivetrain.strategies import DDPStrategy, ParallelStrategy
from drivetrain.strategies.collectives import all_reduce_copy


def _timed(function: Callable[[], None], repeat: int) -> tuple[float, float]:
    dist.barrier()
    cpu, wall = time.thread_time(), time.perf_counter()
    for _ in range(repeat):
        function()
    return (time.thread_time() - cpu) / repeat, (time.perf_counter() - wall) / repeat


def measure(rounds: int, calls: int, steps: int) -> None:
    strategy = dt.connect(accelerator="cpu", strategy="ddp", devices=2)
    strategy.launcher.launch(_measure, strategy, rounds, calls, steps)


def _measure(strategy: ParallelStrategy, rounds: int, calls: int, steps: int) -> None:
    strategy.setup_environment()
    torch.manual_seed(0)
    value = torch.ones(1)
    model = strategy.setup_module(nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(16, 32), torch.randn(16, 1)
    monitor = strategy._monitor

    def step() -> None:
        nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
        optimizer.zero_grad()

    variants: dict[str, Callable[[], tuple[float, float]]] = {
        "all_reduce, wrapped": lambda: _timed(lambda: strategy.all_reduce(value, reduce_op="sum"), calls),
        "all_reduce, bare": lambda: _timed(lambda: all_reduce_copy(value, "sum", None), calls),
        "ddp step, watchdog on": lambda: _timed(step, steps),
        "ddp step, watchdog off": lambda: _with_watchdog_stopped(monitor, lambda: _timed(step, steps)),
    }
    for _ in range(3):
        step()  # warm up DDP's buckets
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in variants}
    for number in range(rounds):
        order = list(variants) if number % 2 == 0 else list(reversed(variants))
        for name in order:
            results[name].append(variants[name]())
    if strategy.global_rank == 0:
        print(f"{rounds} rounds, {calls} calls / {steps} steps each; medians (main-thread CPU, wall):")
        for name, samples in results.items():
            cpu = statistics.median(s[0] for s in samples) * 1e6
            wall = statistics.median(s[1] for s in samples) * 1e6
            print(f"  {name:24s} {cpu:9.2f} us CPU {wall:9.2f} us wall")
    strategy.teardown()


def _with_watchdog_stopped(monitor: object, run: Callable[[], tuple[float, float]]) -> tuple[float, float]:
    stop = getattr(monitor, "_stop", None)
    thread = getattr(monitor, "_thread", None)
    if stop is None or thread is None:
        return run()
    stop.set()
    thread.join()
    try:
        return run()
    finally:
        monitor._thread = None  # type: ignore[attr-defined]
        monitor.start()  # type: ignore[attr-defined]


def instructions(variant: str) -> None:
    os.environ.update({"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1"})
    store = dist.TCPStore("127.0.0.1", 0, 1, is_master=True, timeout=datetime.timedelta(seconds=60))
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    strategy = DDPStrategy(parallel_devices=[torch.device("cpu")])
    value = torch.ones(1)
    if variant == "unmonitored":
        ParallelStrategy._collective = lambda self, operation, payload, function, *args: function(*args)  # type: ignore[method-assign]
    if variant in ("wrapped", "unmonitored"):

        def call(_: int) -> float:
            strategy.all_reduce(value, reduce_op="sum")
            return 1.0
    else:

        def call(_: int) -> float:
            all_reduce_copy(value, "sum", None)
            return 1.0

    math.fsum(map(call, range(200)))
    math.prod(map(call, range(600)))
    dist.destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--calls", type=int, default=500)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--instructions", choices=["wrapped", "unmonitored", "bare"])
    arguments = parser.parse_args()
    if arguments.instructions:
        instructions(arguments.instructions)
    else:
        measure(arguments.rounds, arguments.calls, arguments.steps)
