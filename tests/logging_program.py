"""drivetrain's console output as a user meets it (run by tests/test_logging.py; stdout and stderr in one pipe).

python logging_program.py bar ROOT          # a fit with the progress bar on, messages written while it is drawn
python logging_program.py quiet ROOT        # the same with logging.getLogger("drivetrain") at WARNING
python logging_program.py configured ROOT   # the same after logging.basicConfig(format="CFG ...")
python logging_program.py ddp ROOT          # two processes (the script is re-run for rank 1)
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import drivetrain as dt
from drivetrain.logging import get_logger
from drivetrain.trainer import EarlyStopping, ModelCheckpoint, TQDMProgressBar


class Model(dt.TrainingModule):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layer = nn.Linear(4, 1)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        loss = nn.functional.mse_loss(self.layer(batch[0]), batch[1])
        self.log("loss", loss, prog_bar=True)
        if batch_idx == 2:
            self.print(f"self.print in epoch {self.current_epoch}")
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.log("val_loss", nn.functional.mse_loss(self.layer(batch[0]), batch[1]))

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def main(case: str, root: Path) -> None:
    if case == "quiet":
        logging.getLogger("drivetrain").setLevel(logging.WARNING)
    if case == "configured":
        logging.basicConfig(format="CFG %(name)s: %(message)s", level=logging.INFO)
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(64, 4, generator=generator)
    loader = DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=4)
    ddp = case == "ddp"
    trainer = dt.Trainer(
        accelerator="cpu",
        devices=2 if ddp else 1,
        strategy="ddp" if ddp else "auto",
        max_epochs=2,
        logger=False,
        enable_model_summary=False,
        callbacks=[
            TQDMProgressBar(refresh_interval=0),
            ModelCheckpoint(dirpath=root / "ckpt", monitor="val_loss", filename="{epoch}", verbose=True),
            EarlyStopping(monitor="val_loss", patience=5, verbose=True),
        ],
    )
    trainer.fit(Model(), loader, loader)
    if ddp:
        logging.basicConfig(
            format="%(message)s", level=logging.INFO
        )  # user loggers print where the user says
        get_logger("user.script").info(
            f"in turn from rank {trainer.global_rank}", main_process_only=False, in_order=True
        )
        get_logger("user.script").info(f"once from rank {trainer.global_rank}")


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))
