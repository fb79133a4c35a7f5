"""A user's training script with its own argparse, run under DeepSpeed's launcher or drivetrain's.

DeepSpeed's launcher appends ``--local_rank=N``; the script drops it before parsing. Each rank
prints one line (one ``os.write``, so lines from ranks sharing stdout never interleave).
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for helpers.sharded

import drivetrain as dt
from drivetrain.cli.launcher_arguments import drop_launcher_arguments
from helpers.sharded import LR, Net, batches, loss_of, shard


def main() -> None:
    warnings.simplefilter("ignore", FutureWarning)  # DeepSpeed's use of deprecated torch collectives
    parser = argparse.ArgumentParser()
    parser.add_argument("--strategy", default="deepspeed_stage_2")
    parser.add_argument("--steps", type=int, default=2)
    args = parser.parse_args(drop_launcher_arguments(sys.argv[1:]))
    strategy = dt.connect(accelerator="cpu", strategy=args.strategy, devices=2)
    given = any(a.startswith("--local_rank") for a in sys.argv[1:])
    strategy.launcher.launch(train, strategy, args.steps, given)


def train(strategy: dt.Strategy, steps: int, local_rank_argument: bool) -> None:
    strategy.setup_environment()
    torch.manual_seed(0)
    model = Net()
    engine, [optimizer] = strategy.setup_module_and_optimizers(
        model, [torch.optim.Adam(model.parameters(), lr=LR)]
    )
    losses = []
    for batch in batches(steps):
        x, y = shard(batch, strategy.global_rank)
        loss = loss_of(engine(x), y)
        strategy.backward(loss, engine)
        strategy.optimizer_step(optimizer, model=engine)
        losses.append(round(loss.item(), 6))
    line = f"rank {strategy.global_rank} of {strategy.world_size} --local_rank={local_rank_argument} losses {losses}\n"
    os.write(1, line.encode())
    strategy.teardown()


if __name__ == "__main__":
    main()
