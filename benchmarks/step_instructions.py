"""Instructions per training step under callgrind: drivetrain's front doors against raw PyTorch.

Timings on a shared machine drift by several percent; instruction counts do not, so this is the
number to compare before and after a change to the per-step path. Each variant runs in its own
process under ``valgrind --tool=callgrind``: it trains the tiny MLP for 100 steps inside
``math.fsum`` and for 300 steps inside ``math.prod``, so the difference of the two functions'
inclusive counts, divided by 200, is the cost of one step (set-up, imports and teardown cancel).

    python -m benchmarks.step_instructions                        # every variant (~10 min on 2 cores)
    python -m benchmarks.step_instructions --variants raw,trainer
    PYTHONPATH=/path/to/other/checkout/src python -m benchmarks.step_instructions   # another version

Variants (each compared with the raw loop that iterates the same kind of data):

* ``raw``: ``loss = mse(model(x), y); loss.backward(); opt.step(); opt.zero_grad()`` over a list of batches;
* ``trainer``: ``Trainer.fit`` over the same list (``training_step`` returns the loss);
* ``trainer+clip``: the same with ``gradient_clip_val=1.0``; its reference is ``raw+clip``;
* ``raw-loader``: the raw step over a ``DataLoader`` (batch 64, no shuffling);
* ``accelerator``: ``prepare(model, optimizer, loader)``, ``accelerator.backward(loss)``;
* ``accelerator+accumulate``: the same inside ``with accelerator.accumulate(model):``.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable
from typing import Any

#: variant → the raw variant it is compared with
VARIANTS = {
    "raw": "raw",
    "trainer": "raw",
    "raw+clip": "raw+clip",
    "trainer+clip": "raw+clip",
    "raw-loader": "raw-loader",
    "accelerator": "raw-loader",
    "accelerator+accumulate": "raw-loader",
}
BATCH = 64


def _program(variant: str) -> Callable[[int], None]:
    """A function that trains ``steps`` steps of ``variant`` from scratch."""
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    import drivetrain as dt

    torch.set_num_threads(1)

    def model() -> nn.Module:
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))

    def batches(steps: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        generator = torch.Generator().manual_seed(1)
        return [
            (torch.randn(BATCH, 32, generator=generator), torch.randn(BATCH, 1, generator=generator))
            for _ in range(steps)
        ]

    def loader(steps: int) -> DataLoader[Any]:
        x, y = zip(*batches(steps))
        return DataLoader(TensorDataset(torch.cat(x), torch.cat(y)), batch_size=BATCH, shuffle=False)

    def raw(steps: int, data: Any = None, clip: bool = False) -> None:
        net = model()
        optimizer = torch.optim.SGD(net.parameters(), lr=0.01)
        for x, y in data if data is not None else batches(steps):
            loss = nn.functional.mse_loss(net(x), y)
            loss.backward()
            if clip:
                torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad()

    class Regressor(dt.TrainingModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = model()

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            return nn.functional.mse_loss(self.net(x), y)

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    root = tempfile.mkdtemp()

    def trainer(steps: int, clip: bool = False) -> None:
        fit = dt.Trainer(
            accelerator="cpu",
            devices=1,
            max_epochs=1,
            logger=False,
            enable_progress_bar=False,
            enable_checkpointing=False,
            enable_model_summary=False,
            default_root_dir=root,
            gradient_clip_val=1.0 if clip else None,
        )
        fit.fit(Regressor(), train_dataloaders=batches(steps))

    def accelerator(steps: int, accumulate: bool = False) -> None:
        acc = dt.Accelerator(cpu=True)
        net = model()
        net, optimizer, data = acc.prepare(net, torch.optim.SGD(net.parameters(), lr=0.01), loader(steps))
        for x, y in data:
            if accumulate:
                with acc.accumulate(net):
                    loss = nn.functional.mse_loss(net(x), y)
                    acc.backward(loss)
                    optimizer.step()
                    optimizer.zero_grad()
            else:
                loss = nn.functional.mse_loss(net(x), y)
                acc.backward(loss)
                optimizer.step()
                optimizer.zero_grad()

    return {
        "raw": lambda steps: raw(steps),
        "raw+clip": lambda steps: raw(steps, clip=True),
        "raw-loader": lambda steps: raw(steps, loader(steps)),
        "trainer": lambda steps: trainer(steps),
        "trainer+clip": lambda steps: trainer(steps, clip=True),
        "accelerator": lambda steps: accelerator(steps),
        "accelerator+accumulate": lambda steps: accelerator(steps, accumulate=True),
    }[variant]


def run_marked(variant: str) -> None:
    """The measured process: warm up, then 100 steps inside ``math.fsum`` and 300 inside ``math.prod``."""
    train = _program(variant)

    def run(steps: int) -> float:
        train(steps)
        return 0.0

    run(20), run(20)  # imports, allocator, first-call paths
    math.fsum(run(100) for _ in range(1))
    math.prod(run(300) for _ in range(1))


def _inclusive(annotated: str, function: str) -> int:
    for line in annotated.splitlines():
        if re.search(rf"\b{function}\b", line) and "(" in line:
            return int(line.split()[0].replace(",", ""))
    raise RuntimeError(f"callgrind_annotate printed no line for {function}")


def measure(variant: str, workdir: str) -> float:
    """Instructions per step of ``variant`` (runs it under callgrind)."""
    out = os.path.join(workdir, f"callgrind.{variant}")
    subprocess.run(
        [
            "valgrind",
            "--tool=callgrind",
            f"--callgrind-out-file={out}",
            sys.executable,
            "-m",
            __spec__.name,
            "--run",
            variant,
        ],
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    annotated = subprocess.run(
        ["callgrind_annotate", "--inclusive=yes", "--threshold=100", out],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return (_inclusive(annotated, "math_prod") - _inclusive(annotated, "math_fsum")) / 200


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--variants", default=",".join(VARIANTS), help="comma-separated subset of: " + ", ".join(VARIANTS)
    )
    parser.add_argument("--run", choices=list(VARIANTS), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.run:
        run_marked(args.run)
        return
    chosen = args.variants.split(",")
    unknown = sorted(set(chosen) - set(VARIANTS))
    if unknown:
        parser.error(f"unknown variant(s) {', '.join(unknown)}; choose from {', '.join(VARIANTS)}")
    needed = list(dict.fromkeys([VARIANTS[v] for v in chosen] + chosen))
    import drivetrain

    print(f"drivetrain from {os.path.dirname(drivetrain.__file__)}")
    counts: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as workdir:
        for variant in needed:
            counts[variant] = measure(variant, workdir)
            print(f"  measured {variant}", file=sys.stderr, flush=True)
    print(f"{'variant':<24} {'instructions/step':>18} {'vs':>12} {'ratio':>7}")
    for variant in chosen:
        reference = VARIANTS[variant]
        print(
            f"{variant:<24} {counts[variant]:18,.0f} {reference:>12} {counts[variant] / counts[reference]:7.4f}"
        )


if __name__ == "__main__":
    main()
