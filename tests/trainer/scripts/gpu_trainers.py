"""The seeds' GPU Trainer examples as real programs (run by tests marked ``cuda``).

python gpu_trainers.py static_graph ROOT   # Trainer(strategy=DDPStrategy(static_graph=True), accelerator="gpu", devices=4)
python gpu_trainers.py custom_io ROOT      # Trainer(strategy="ddp_custom_checkpoint_io", accelerator="gpu", devices=2)
"""

from __future__ import annotations

import os
import sys

import torch
from seed_trainers import QUIET, CustomCheckpointIO, Model, data, loader

import drivetrain as dt
from drivetrain.strategies import DDPStrategy, StrategyRegistry
from drivetrain.trainer import ModelCheckpoint


def main(case: str, root: str) -> None:
    if case == "static_graph":
        devices = min(4, torch.cuda.device_count())
        trainer = dt.Trainer(
            strategy=DDPStrategy(static_graph=True),
            accelerator="gpu",
            devices=devices,
            max_epochs=2,
            enable_checkpointing=False,
            **QUIET,
        )
    else:
        StrategyRegistry.register(
            "ddp_custom_checkpoint_io",
            DDPStrategy,
            description="DDP with a custom CheckpointIO",
            checkpoint_io=CustomCheckpointIO(),
        )
        trainer = dt.Trainer(
            strategy="ddp_custom_checkpoint_io",
            accelerator="gpu",
            devices=2,
            max_epochs=2,
            callbacks=[ModelCheckpoint(dirpath=root, filename="{epoch}")],
            **QUIET,
        )
    model = Model()
    trainer.fit(model, loader(data()))
    line = (
        f"rank={trainer.global_rank} device={trainer.strategy.root_device.type} world={trainer.world_size} "
        f"steps={trainer.global_step} finished={trainer.state.finished}\n"
    )
    os.write(1, line.encode())


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
