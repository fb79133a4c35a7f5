"""Train a small classifier on scikit-learn's bundled digits with DDP on 2 CPU processes.

This drives a drivetrain Strategy directly: the same calls both front doors make.

    python examples/demo_strategy_digits.py                # 2 processes, CPU
    python examples/demo_strategy_digits.py --devices 1    # one process
"""

from __future__ import annotations

import argparse
import time

import torch
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import drivetrain as dt


def datasets() -> tuple[TensorDataset, TensorDataset]:
    digits = load_digits()
    x = torch.tensor(digits.data, dtype=torch.float32) / 16.0
    y = torch.tensor(digits.target, dtype=torch.long)
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(0))
    train, val = order[:1500], order[1500:]
    return TensorDataset(x[train], y[train]), TensorDataset(x[val], y[val])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=8)
    args = parser.parse_args()

    strategy = dt.connect(accelerator="cpu", devices=args.devices)
    strategy.launcher.launch(train, strategy, args.epochs) if strategy.launcher else train(
        strategy, args.epochs
    )


def train(strategy: dt.strategies.Strategy, epochs: int) -> None:
    strategy.setup_environment()
    dt.seed_everything(0)
    train_set, val_set = datasets()
    sampler_kwargs = strategy.distributed_sampler_kwargs or {"num_replicas": 1, "rank": 0}
    train_sampler = DistributedSampler(train_set, shuffle=True, seed=0, **sampler_kwargs)
    train_loader = DataLoader(train_set, batch_size=32, sampler=train_sampler)
    val_loader = DataLoader(
        val_set, batch_size=128, sampler=DistributedSampler(val_set, shuffle=False, **sampler_kwargs)
    )
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
    strategy.module_to_device(model)
    model = strategy.setup_module(model)
    optimizer = strategy.setup_optimizer(torch.optim.Adam(model.parameters(), lr=3e-3))
    log = print if strategy.is_global_zero else (lambda *a, **k: None)
    log(f"training on {strategy.world_size} process(es) with {type(strategy).__name__}")
    started = time.perf_counter()
    for epoch in range(epochs):
        train_sampler.set_epoch(epoch)
        model.train()
        total = torch.zeros(2)
        for x, y in train_loader:
            x, y = strategy.batch_to_device((x, y))
            loss = nn.functional.cross_entropy(model(x), y)
            strategy.backward(loss, model)
            strategy.optimizer_step(optimizer)
            optimizer.zero_grad()
            total += torch.tensor([loss.item() * len(y), len(y)])
        total = strategy.all_reduce(total, reduce_op="sum")
        accuracy = evaluate(strategy, model, val_loader)
        log(f"epoch {epoch + 1}/{epochs}  train loss {total[0] / total[1]:.4f}  val accuracy {accuracy:.3f}")
    log(f"final validation accuracy: {accuracy:.3f} ({time.perf_counter() - started:.1f} s)")
    strategy.teardown()


@torch.no_grad()
def evaluate(strategy: dt.strategies.Strategy, model: nn.Module, loader: DataLoader) -> float:
    model.eval()
    counts = torch.zeros(2)
    for x, y in loader:
        x, y = strategy.batch_to_device((x, y))
        counts += torch.tensor([(model(x).argmax(1) == y).sum().item(), len(y)])
    counts = strategy.all_reduce(counts, reduce_op="sum")
    return float(counts[0] / counts[1])


if __name__ == "__main__":
    main()
