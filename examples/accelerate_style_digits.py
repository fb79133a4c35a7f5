"""Train a digits classifier in the Accelerate style, with ``drivetrain.Accelerator``.

An Accelerate script with one changed import (``from drivetrain import Accelerator``). The same
file runs on one process or several, however it is started:

    python examples/accelerate_style_digits.py                      # one process
    python examples/accelerate_style_digits.py --devices 2          # starts its second process itself
    drivetrain launch -n 2 examples/accelerate_style_digits.py      # 2 processes
    torchrun --standalone --nproc-per-node 2 examples/accelerate_style_digits.py
    python examples/accelerate_style_digits.py --mixed-precision bf16 --accumulate 2
"""

from __future__ import annotations

import argparse
import time

import torch
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from drivetrain import Accelerator
from drivetrain.utils import set_seed


def datasets() -> tuple[TensorDataset, TensorDataset]:
    digits = load_digits()
    x = torch.tensor(digits.data, dtype=torch.float32) / 16.0
    y = torch.tensor(digits.target, dtype=torch.long)
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(0))
    train, val = order[:1500], order[1500:]
    return TensorDataset(x[train], y[train]), TensorDataset(x[val], y[val])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=None, help="processes to start (default: as launched)")
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--mixed-precision", default="no", choices=["no", "bf16", "fp16"])
    parser.add_argument("--accumulate", type=int, default=1, help="gradient accumulation steps")
    args = parser.parse_args()

    accelerator = Accelerator(
        cpu=True,
        devices=args.devices,
        mixed_precision=args.mixed_precision,
        gradient_accumulation_steps=args.accumulate,
    )
    set_seed(0)
    train_set, val_set = datasets()
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    train_loader = DataLoader(train_set, batch_size=32, shuffle=True)
    val_loader = DataLoader(val_set, batch_size=64)
    # Written for the batches of one process: the prepared scheduler keeps it right for N.
    scheduler = torch.optim.lr_scheduler.OneCycleLR(
        optimizer, max_lr=3e-3, total_steps=args.epochs * len(train_loader) // args.accumulate
    )
    model, optimizer, train_loader, val_loader, scheduler = accelerator.prepare(
        model, optimizer, train_loader, val_loader, scheduler
    )
    accelerator.print(f"training on {accelerator.num_processes} process(es), {accelerator.mixed_precision=}")

    started = time.perf_counter()
    for epoch in range(args.epochs):
        model.train()
        for x, y in train_loader:
            with accelerator.accumulate(model):
                loss = nn.functional.cross_entropy(model(x), y)
                accelerator.backward(loss)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()

        model.eval()
        correct, total = 0, 0
        for x, y in val_loader:
            with torch.no_grad():
                predictions = model(x).argmax(dim=1)
            predictions, references = accelerator.gather_for_metrics((predictions, y))
            correct += int((predictions == references).sum())
            total += len(references)
        accelerator.print(f"epoch {epoch + 1}/{args.epochs}  val accuracy {correct / total:.3f}")

    accelerator.wait_for_everyone()
    accelerator.print(
        f"done: {accelerator.num_processes} process(es), accuracy {correct / total:.3f} on {total} validation "
        f"items in {time.perf_counter() - started:.1f} s"
    )
    accelerator.end_training()


if __name__ == "__main__":
    main()
