"""A Lightning program that runs on ``drivetrain.Trainer`` with only its imports changed.

A classifier of four Gaussian blobs in the plane, written the way Lightning users write one: a
``DataModule``, ``ModelCheckpoint`` (best two and the last), ``EarlyStopping``,
``LearningRateMonitor``, validation twice per epoch, gradient accumulation and clipping, then
test and predict with the best checkpoint. Run it again with ``--resume`` and a larger
``--max-epochs`` and it continues from the last checkpoint.

    python examples/lightning_style_blobs.py --root runs/blobs                          # one process
    python examples/lightning_style_blobs.py --root runs/blobs --max-epochs 6 --resume  # continues
    python examples/lightning_style_blobs.py --root runs/ddp --devices 2 --strategy ddp # 2 processes

The block below is the only difference from a Lightning program: with
``EXAMPLE_FRAMEWORK=lightning`` (and ``lightning`` installed) the same file runs on Lightning.
Rank 0 writes what the run did to ``ROOT/summary.json`` (appending one entry per run).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

# -- the imports: the only lines that differ from the Lightning program -------------------------
if os.environ.get("EXAMPLE_FRAMEWORK", "drivetrain") == "lightning":
    import lightning.pytorch as framework
    from lightning.pytorch import LightningDataModule as DataModule
    from lightning.pytorch import LightningModule as TrainingModule
    from lightning.pytorch.callbacks import EarlyStopping, LearningRateMonitor, ModelCheckpoint
    from lightning.pytorch.loggers import CSVLogger
else:
    import drivetrain as framework
    from drivetrain import DataModule, TrainingModule
    from drivetrain.loggers import CSVLogger
    from drivetrain.trainer import EarlyStopping, LearningRateMonitor, ModelCheckpoint
# ------------------------------------------------------------------------------------------------

CENTRES = torch.tensor([[2.0, 2.0], [-2.0, 2.0], [-2.0, -2.0], [2.0, -2.0]])


class Blobs(DataModule):
    """Points around four centres; the label is the centre. Made from a fixed seed, no download."""

    def __init__(self, batch_size: int = 16) -> None:
        super().__init__()
        self.save_hyperparameters()

    def setup(self, stage: str) -> None:
        generator = torch.Generator().manual_seed(1234)
        labels = torch.randint(0, 4, (896,), generator=generator)
        points = CENTRES[labels] + 1.5 * torch.randn(896, 2, generator=generator)
        self.train_set = TensorDataset(points[:512], labels[:512])
        self.val_set = TensorDataset(points[512:640], labels[512:640])
        self.test_set = TensorDataset(points[640:832], labels[640:832])
        self.predict_set = TensorDataset(points[832:])

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.train_set, batch_size=self.hparams.batch_size, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val_set, batch_size=32)

    def test_dataloader(self) -> DataLoader:
        return DataLoader(self.test_set, batch_size=32)

    def predict_dataloader(self) -> DataLoader:
        return DataLoader(self.predict_set, batch_size=32)


class BlobClassifier(TrainingModule):
    """A small perceptron; Adam with a learning rate that halves every epoch."""

    def __init__(self, hidden: int = 32, lr: float = 0.05) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(2, hidden), nn.Tanh(), nn.Linear(hidden, 4))

    def forward(self, points: torch.Tensor) -> torch.Tensor:
        return self.net(points)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        points, labels = batch
        loss = nn.functional.cross_entropy(self(points), labels)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        points, labels = batch
        logits = self(points)
        self.log("val_loss", nn.functional.cross_entropy(logits, labels), prog_bar=True, sync_dist=True)
        self.log("val_acc", (logits.argmax(1) == labels).float().mean(), sync_dist=True)

    def test_step(self, batch: Any, batch_idx: int) -> None:
        points, labels = batch
        self.log("test_acc", (self(points).argmax(1) == labels).float().mean(), sync_dist=True)

    def predict_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self(batch[0]).argmax(1)

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.Adam(self.parameters(), lr=self.hparams.lr)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "epoch"}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default="runs/lightning-style-blobs", help="where logs and checkpoints go")
    parser.add_argument("--devices", type=int, default=1)
    parser.add_argument("--strategy", default="auto")
    parser.add_argument("--max-epochs", type=int, default=3)
    parser.add_argument("--resume", action="store_true", help="continue from the last checkpoint in --root")
    parser.add_argument("--quiet", action="store_true", help="no progress bar or model summary")
    args = parser.parse_args()
    root = Path(args.root)

    framework.seed_everything(7)
    checkpoints = ModelCheckpoint(
        dirpath=root / "checkpoints",
        filename="{epoch}-{step}-{val_loss:.4f}",
        monitor="val_loss",
        mode="min",
        save_top_k=2,
        save_last=True,
    )
    early_stopping = EarlyStopping(monitor="val_loss", mode="min", patience=4)
    trainer = framework.Trainer(
        accelerator="cpu",
        devices=args.devices,
        strategy=args.strategy,
        max_epochs=args.max_epochs,
        val_check_interval=0.5,
        accumulate_grad_batches=2,
        gradient_clip_val=1.0,
        log_every_n_steps=2,
        callbacks=[checkpoints, early_stopping, LearningRateMonitor(logging_interval="epoch")],
        logger=CSVLogger(root, name="logs"),
        enable_progress_bar=not args.quiet,
        enable_model_summary=not args.quiet,
    )
    data = Blobs()
    model = BlobClassifier()
    trainer.fit(model, datamodule=data, ckpt_path="last" if args.resume else None)
    fitted = {"global_step": trainer.global_step, "epoch": trainer.current_epoch}
    tested = trainer.test(model, datamodule=data, ckpt_path="best", verbose=False)
    predictions = trainer.predict(model, datamodule=data, ckpt_path="best")

    if trainer.is_global_zero:
        summary = {
            "resumed": args.resume,
            "world_size": trainer.world_size,
            "fit": fitted,
            "stopped_early": early_stopping.stopped_epoch > 0,
            "best_model_path": checkpoints.best_model_path,
            "best_model_score": float(checkpoints.best_model_score),
            "best_k_models": {path: float(score) for path, score in checkpoints.best_k_models.items()},
            "last_model_path": checkpoints.last_model_path,
            "test": tested[0],
            "predicted_labels": [int(label) for batch in predictions for label in batch],
            "metrics_file": os.path.join(trainer.logger.log_dir, "metrics.csv"),
        }
        path = root / "summary.json"
        runs = json.loads(path.read_text()) if path.exists() else []
        path.write_text(json.dumps([*runs, summary], indent=1))
        print(
            f"{'resumed' if args.resume else 'trained'} to step {fitted['global_step']} (epoch "
            f"{fitted['epoch']}) on {trainer.world_size} process(es); best {checkpoints.best_model_path} "
            f"(val_loss {float(checkpoints.best_model_score):.4f}); test accuracy {tested[0]['test_acc']:.3f}"
        )


if __name__ == "__main__":
    main()
