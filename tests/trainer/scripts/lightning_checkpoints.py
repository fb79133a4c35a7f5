"""Writes checkpoints with real PyTorch Lightning (run by the peers' interpreter, not drivetrain's).

Usage: python lightning_checkpoints.py OUT_DIR. Writes ``OUT_DIR/epoch_end.ckpt`` (after epoch 1 of
a 2-epoch fit, at the epoch end), ``OUT_DIR/mid_epoch.ckpt`` (after 3 steps of epoch 1) and
``OUT_DIR/schedules.json``: the files ModelCheckpoint writes in each of ``SCENARIOS`` (an oracle
for drivetrain's ModelCheckpoint).
The module mirrors ``trainer_models.Regression`` (same parameter names and hyperparameters).
"""

import json
import shutil
import sys
from pathlib import Path

import lightning.pytorch as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Regression(pl.LightningModule):
    def __init__(
        self, features: int = 4, lr: float = 0.05, dropout: float = 0.0, optimizer: str = "adam"
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(features, 8), nn.Dropout(dropout), nn.Tanh(), nn.Linear(8, 1))

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.mse_loss(self(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self(x), y))

    def configure_optimizers(self):
        optimizer = torch.optim.Adam(self.parameters(), lr=self.hparams.lr)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=3, gamma=0.5)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


class StopMidEpoch(pl.Callback):
    def __init__(self, out: Path) -> None:
        self.out = out

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.current_epoch == 1 and batch_idx == 2:
            trainer.save_checkpoint(self.out / "mid_epoch.ckpt")


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(64, 4, generator=generator)
    y = x @ torch.arange(1.0, 5.0).unsqueeze(1) + 0.1 * torch.randn(64, 1, generator=generator)
    data = DataLoader(TensorDataset(x, y), batch_size=8)
    pl.seed_everything(0)
    checkpoint = pl.callbacks.ModelCheckpoint(dirpath=out / "run", monitor="val_loss", save_last=True)
    stopping = pl.callbacks.EarlyStopping(monitor="val_loss", patience=5)
    trainer = pl.Trainer(
        max_epochs=2,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[checkpoint, stopping, StopMidEpoch(out)],
        default_root_dir=out,
    )
    trainer.fit(Regression(), data, data)
    shutil.copy(checkpoint.last_model_path, out / "epoch_end.ckpt")
    schedules(out, data)


# name -> (ModelCheckpoint arguments, Trainer arguments); the same table is in the drivetrain test.
SCENARIOS = {
    "interval_half": ({"save_top_k": -1}, {"val_check_interval": 0.5}),
    "every_other_epoch_validation": ({"save_top_k": -1}, {"check_val_every_n_epoch": 2}),
    "once_per_epoch": ({"save_top_k": -1}, {}),
    "train_epoch_end": ({"save_top_k": -1, "save_on_train_epoch_end": True}, {"val_check_interval": 0.5}),
    "steps_with_accumulation": ({"save_top_k": -1, "every_n_train_steps": 3}, {"accumulate_grad_batches": 2}),
    "epoch_names_twice": (
        {"save_top_k": -1, "filename": "{epoch}", "save_last": True},
        {"val_check_interval": 0.5},
    ),
    # save_last when the fit saves nothing else: last.ckpt when training ends (Lightning 2.6's on_train_end).
    "last_without_top_k": ({"save_top_k": 0, "save_last": True}, {}),
    "last_after_too_few_epochs": ({"every_n_epochs": 3, "save_last": True}, {}),
    "last_after_fast_dev_run": ({"save_last": True}, {"fast_dev_run": True}),
}


def schedules(out: Path, data: DataLoader) -> None:
    files = {}
    for name, (checkpoint_args, trainer_args) in SCENARIOS.items():
        folder = out / "schedules" / name
        for run in (1, 2):  # the second run writes into the first run's folder
            trainer = pl.Trainer(
                max_epochs=2,
                accelerator="cpu",
                devices=1,
                logger=False,
                enable_progress_bar=False,
                enable_model_summary=False,
                num_sanity_val_steps=0,
                callbacks=[pl.callbacks.ModelCheckpoint(dirpath=folder, **checkpoint_args)],
                **trainer_args,
            )
            trainer.fit(Regression(), data, data)
            files[f"{name}/{run}"] = sorted(p.name for p in folder.iterdir())
    (out / "schedules.json").write_text(json.dumps(files, indent=1))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
