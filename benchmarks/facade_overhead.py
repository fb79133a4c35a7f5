"""Per-step overhead of ``drivetrain.Accelerator`` against a hand-written PyTorch loop.

The loops train the same tiny MLP with the same optimizer on the same CPU data, each through
its own shuffling DataLoader (batch 32): fetch a batch, forward, MSE loss, backward, optimizer
step, zero_grad.
The façade loops are Accelerate style (``prepare``, ``accelerator.backward``), once plainly and
once inside ``accelerator.accumulate(model)``. The loops advance one step at a time in turn
(the order alternating), each step is timed on its own, and the medians are compared: a
background process slowing the machine down hits every loop alike, and the median ignores the
steps it interrupted. The last column compares each step with the hand-written step timed
right next to it.

    python benchmarks/facade_overhead.py                     # 6000 steps per loop, 1 thread
    python benchmarks/facade_overhead.py --steps 20000 --threads 2
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import drivetrain as dt


def build() -> tuple[nn.Module, torch.optim.Optimizer, TensorDataset]:
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(4096, 32), torch.randn(4096, 1))
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))
    return model, torch.optim.SGD(model.parameters(), lr=1e-3), data


class Loop:
    """One training loop, advanced a step at a time; epochs restart the loader as a for loop would."""

    def __init__(self, loader: Any, step: Callable[[Any], None]) -> None:
        self.loader = loader
        self.step = step
        self.batches: Iterator[Any] = iter(loader)
        self.times: list[float] = []

    def advance(self) -> None:
        started = time.perf_counter()
        batch = next(self.batches, None)
        if batch is None:
            self.batches = iter(self.loader)
            batch = next(self.batches)
        self.step(batch)
        self.times.append(time.perf_counter() - started)


def hand_written(model: nn.Module, optimizer: torch.optim.Optimizer, data: TensorDataset) -> Loop:
    def step(batch: Any) -> None:
        x, y = batch
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()

    return Loop(DataLoader(data, batch_size=32, shuffle=True), step)


def with_accelerator(
    accelerator: dt.Accelerator, model: nn.Module, optimizer: torch.optim.Optimizer, data: TensorDataset
) -> Loop:
    model, optimizer, loader = accelerator.prepare(
        model, optimizer, DataLoader(data, batch_size=32, shuffle=True)
    )

    def step(batch: Any) -> None:
        x, y = batch
        loss = nn.functional.mse_loss(model(x), y)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()

    return Loop(loader, step)


def with_accumulate(
    accelerator: dt.Accelerator, model: nn.Module, optimizer: torch.optim.Optimizer, data: TensorDataset
) -> Loop:
    model, optimizer, loader = accelerator.prepare(
        model, optimizer, DataLoader(data, batch_size=32, shuffle=True)
    )

    def step(batch: Any) -> None:
        with accelerator.accumulate(model):
            x, y = batch
            loss = nn.functional.mse_loss(model(x), y)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()

    return Loop(loader, step)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6000, help="timed steps per loop")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    # One model, optimizer and dataset for all loops: separately allocated copies differ in speed
    # by several percent (memory placement), which would swamp the overhead being measured.
    model, optimizer, data = build()
    plain, accumulating = dt.Accelerator(cpu=True), dt.Accelerator(cpu=True)
    loops = {
        "hand-written": hand_written(model, optimizer, data),
        "Accelerator": with_accelerator(plain, model, optimizer, data),
        "Accelerator + accumulate": with_accumulate(accumulating, model, optimizer, data),
    }
    order = list(loops.values())
    for _ in range(300):  # warm-up: allocator, caches, first epochs
        for loop in order:
            loop.advance()
    for loop in order:
        loop.times.clear()
    for index in range(args.steps):
        for loop in order if index % 2 == 0 else reversed(order):
            loop.advance()

    reference = loops["hand-written"].times
    baseline = statistics.median(reference)
    print(f"torch {torch.__version__}, {args.threads} thread(s), {args.steps} interleaved steps per loop")
    print(f"{'loop':<26} {'median':>10}   {'ratio of medians':>16}   {'median of paired ratios':>23}")
    for name, loop in loops.items():
        median = statistics.median(loop.times)
        paired = statistics.median(t / r for t, r in zip(loop.times, reference))
        print(f"{name:<26} {median * 1e6:7.1f} us   {median / baseline:16.3f}   {paired:23.3f}")


if __name__ == "__main__":
    main()
