"""A small fit and test with a chosen progress bar, for the output tests (tests/trainer/test_progress_bars.py).

    python progress_program.py tqdm 2    # TQDMProgressBar, 2 CPU processes (ddp; the script re-runs itself)
    python progress_program.py rich 1    # RichProgressBar, one process

Run with its output redirected to a file it writes plain lines; run in a terminal it draws bars.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # tests/: the shared models

import drivetrain as dt
from drivetrain.trainer.callbacks import RichProgressBar, TQDMProgressBar
from trainer.trainer_models import Regression, loader, regression_data


class Talking(Regression):
    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        if batch_idx == 1 and self.current_epoch == 0:
            self.print("message from training_step")
        return super().training_step(batch, batch_idx)


def main(kind: str, devices: int) -> None:
    torch.manual_seed(0)
    bar = RichProgressBar(leave=False) if kind == "rich" else TQDMProgressBar()
    trainer = dt.Trainer(
        accelerator="cpu",
        devices=devices,
        strategy="ddp" if devices > 1 else "auto",
        max_epochs=2,
        logger=False,
        enable_checkpointing=False,
        callbacks=[bar],
    )
    model = Talking()
    trainer.fit(model, loader(regression_data(64)), loader(regression_data(32, seed=1)))
    trainer.test(model, loader(regression_data(32, seed=2)), verbose=False)
    trainer.print("program finished")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
