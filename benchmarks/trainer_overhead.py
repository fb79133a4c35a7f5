"""Per-step overhead of ``drivetrain.Trainer`` against a hand-written PyTorch loop.

The same tiny MLP, the same pre-built batches and the same number of steps are run three ways,
interleaved round by round so that machine noise hits all three alike:

* ``raw``: ``loss = model(x); loss.backward(); opt.step(); opt.zero_grad()`` in a Python loop;
* ``trainer``: ``Trainer.fit`` with a ``training_step`` that returns the loss;
* ``trainer+log``: the same with one ``self.log("loss", loss)`` per step.

The Trainer runs with the progress bar, checkpointing and model summary off and the default
logger on (TensorBoard when installed, else CSV, every ``log_every_n_steps``). Its time per step is measured between
``on_train_start`` and ``on_train_end`` (hooks outside the step loop, so they cost nothing per
step). Medians over the rounds are reported, with the ratios to the raw loop, for two clocks: the
main thread's CPU time (what the loop itself costs; insensitive to other programs competing for
the cores) and wall time. torch runs on one intra-op thread so the CPU time covers the compute.

    python benchmarks/trainer_overhead.py               # defaults: 300 steps, 15 rounds
    python benchmarks/trainer_overhead.py --steps 500 --rounds 25

Timings on a shared machine drift by several percent between rounds. Instruction counts do
not: ``--instructions VARIANT`` runs that variant for 100 steps inside ``math.fsum`` and for 300
steps inside ``math.prod``, so under callgrind the difference of the two functions' inclusive
counts, divided by 200, is the cost of one step::

    for v in raw trainer trainer+log; do
      valgrind --tool=callgrind --callgrind-out-file=cg.$v python benchmarks/trainer_overhead.py --instructions $v
      callgrind_annotate --inclusive=yes cg.$v | grep -E "math_(fsum|prod) "
    done
"""

from __future__ import annotations

import argparse
import math
import statistics
import tempfile
import time
from typing import Any

import torch
from torch import nn

import drivetrain as dt


def make_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))


def make_batches(steps: int, batch_size: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(1)
    return [
        (torch.randn(batch_size, 32, generator=generator), torch.randn(batch_size, 1, generator=generator))
        for _ in range(steps)
    ]


Timing = tuple[float, float]  # (CPU seconds per step, wall seconds per step)


def _clocks() -> Timing:
    return time.thread_time(), time.perf_counter()


def raw_loop(batches: list[tuple[torch.Tensor, torch.Tensor]]) -> Timing:
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    cpu, wall = _clocks()
    for x, y in batches:
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    cpu_end, wall_end = _clocks()
    return (cpu_end - cpu) / len(batches), (wall_end - wall) / len(batches)


class Regressor(dt.TrainingModule):
    def __init__(self, log: bool) -> None:
        super().__init__()
        self.model = make_model()
        self.log_loss = log

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.mse_loss(self.model(x), y)
        if self.log_loss:
            self.log("loss", loss)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


class StepTimer(dt.trainer.Callback):
    """Times the training loop between two hooks that run once per fit."""

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self.start = _clocks()

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        end = _clocks()
        self.elapsed = (end[0] - self.start[0], end[1] - self.start[1])


def trainer_loop(batches: list[tuple[torch.Tensor, torch.Tensor]], log: bool, root: str) -> Timing:
    timer = StepTimer()
    trainer = dt.Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=1,
        callbacks=[timer],
        enable_progress_bar=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        default_root_dir=root,
    )
    trainer.fit(Regressor(log), train_dataloaders=batches)
    assert trainer.global_step == len(batches)
    return timer.elapsed[0] / len(batches), timer.elapsed[1] / len(batches)


def count_instructions(variant: str, batch_size: int) -> None:
    """Run ``variant`` for 100 steps inside ``math.fsum`` and 300 inside ``math.prod`` (markers for callgrind)."""
    with tempfile.TemporaryDirectory() as root:

        def run(steps: int) -> float:
            batches = make_batches(steps, batch_size)
            if variant == "raw":
                raw_loop(batches)
            else:
                trainer_loop(batches, variant == "trainer+log", root)
            return 0.0

        run(20), run(20)  # warm-up: imports, allocator, first-call paths
        math.fsum(run(100) for _ in range(1))
        math.prod(run(300) for _ in range(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument(
        "--threads", type=int, default=1, help="torch intra-op threads (1 keeps timings steady)"
    )
    parser.add_argument(
        "--instructions", choices=["raw", "trainer", "trainer+log"], help="see the module docstring"
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.instructions:
        count_instructions(args.instructions, args.batch_size)
        return
    batches = make_batches(args.steps, args.batch_size)
    times: dict[str, list[Timing]] = {"raw": [], "trainer": [], "trainer+log": []}
    with tempfile.TemporaryDirectory() as root:
        raw_loop(batches)  # warm-up: allocator, autograd, imports
        trainer_loop(batches, True, root)
        for _ in range(args.rounds):
            times["raw"].append(raw_loop(batches))
            times["trainer"].append(trainer_loop(batches, False, root))
            times["trainer+log"].append(trainer_loop(batches, True, root))
    print(
        f"tiny MLP 32-64-1, batch {args.batch_size}, {args.steps} steps x {args.rounds} rounds, {args.threads} thread(s)"
    )
    for clock, index in (("CPU time", 0), ("wall time", 1)):
        medians = {name: statistics.median(t[index] for t in values) for name, values in times.items()}
        print(f"  {clock} (median per step):")
        for name, median in medians.items():
            print(f"    {name:>12}: {median * 1e6:8.1f} us   ratio {median / medians['raw']:.3f}")


if __name__ == "__main__":
    main()
