"""A fit whose checkpoint folder is on a disk with room for one checkpoint only (run on a small tmpfs).

    python full_disk_fit.py FOLDER

Saves top-1 by a growing score every 2 steps; the second save does not fit beside the first. Prints
the error the fit ends with, then whether the first checkpoint still loads.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from drivetrain.trainer import ModelCheckpoint
from trainer.trainer_models import Regression, loader, quiet_trainer, regression_data


class Heavy(Regression):
    """About 600 kB per checkpoint, and a score that improves every step (each save is a new best)."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("ballast", torch.zeros(150_000))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        self.log("score", float(self.global_step))
        return super().training_step(batch, batch_idx)


def main() -> None:
    folder = Path(sys.argv[1])
    checkpoint = ModelCheckpoint(dirpath=folder, monitor="score", mode="max", every_n_train_steps=2)
    trainer = quiet_trainer(max_steps=6, enable_checkpointing=True, callbacks=[checkpoint])
    try:
        trainer.fit(Heavy(), loader(regression_data(32)))
    except Exception as error:
        print(f"{type(error).__name__}: {error}")
    kept = sorted(p.name for p in folder.iterdir())
    step = torch.load(folder / kept[0], weights_only=True)["global_step"] if kept else None
    print(f"kept {kept} at step {step}")


if __name__ == "__main__":
    main()
