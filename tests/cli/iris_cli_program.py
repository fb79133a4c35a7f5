"""A LightningCLI program in the style of MLflow's IrisClassification example, run by Lightning or drivetrain.

    python iris_cli_program.py lightning|drivetrain OUT [CLI arguments]

The program below the imports is the same for both: only the imports differ. It passes no seed,
so matching results need both CLIs to seed by default (LightningCLI seeds with 0). It calls
``fit`` and then ``test(ckpt_path="best")`` itself (``run=False``), with callback instances in
``trainer_defaults`` and ``save_config_callback=None``, as the MLflow example does. The data
are iris-shaped (150 samples, 4 features, 3 classes) and made here with a fixed generator, so
that neither environment needs a dataset package. Results go to OUT (``torch.save``).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

FRAMEWORK, OUT = sys.argv[1], Path(sys.argv[2]).resolve()
sys.argv = [sys.argv[0], *sys.argv[3:]]
os.chdir(OUT.parent)  # the checkpoints and logs go beside the results

import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset, random_split  # noqa: E402

if FRAMEWORK == "lightning":
    from lightning.pytorch import LightningDataModule, LightningModule
    from lightning.pytorch.callbacks import EarlyStopping, LearningRateMonitor, ModelCheckpoint
    from lightning.pytorch.cli import LightningCLI
else:
    from drivetrain.lightning_names import LightningCLI, LightningDataModule, LightningModule
    from drivetrain.trainer.callbacks import EarlyStopping, LearningRateMonitor, ModelCheckpoint


class IrisClassification(LightningModule):
    def __init__(self, learning_rate: float = 0.01, hidden: int = 10) -> None:
        """A small classifier of iris flowers.

        Args:
            learning_rate: Adam's learning rate.
            hidden: units of each hidden layer.
        """
        super().__init__()
        self.save_hyperparameters()
        self.fc1 = nn.Linear(4, hidden)
        self.fc2 = nn.Linear(hidden, hidden)
        self.fc3 = nn.Linear(hidden, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc3(torch.relu(self.fc2(torch.relu(self.fc1(x)))))

    def _step(self, batch: tuple[torch.Tensor, torch.Tensor], name: str) -> torch.Tensor:
        x, y = batch
        logits = self(x)
        loss = nn.functional.cross_entropy(logits, y)
        self.log(f"{name}_loss", loss, on_step=name == "train", on_epoch=True)
        self.log(f"{name}_acc", (logits.argmax(1) == y).float().mean(), on_epoch=True)
        return loss

    def training_step(self, batch, batch_idx):  # type: ignore[no-untyped-def]
        return self._step(batch, "train")

    def validation_step(self, batch, batch_idx):  # type: ignore[no-untyped-def]
        self._step(batch, "val")

    def test_step(self, batch, batch_idx):  # type: ignore[no-untyped-def]
        self._step(batch, "test")

    def configure_optimizers(self):  # type: ignore[no-untyped-def]
        return torch.optim.Adam(self.parameters(), lr=self.hparams.learning_rate)


class IrisDataModule(LightningDataModule):
    def __init__(self, batch_size: int = 4) -> None:
        """Iris-shaped data: three classes of four measurements.

        Args:
            batch_size: samples per batch.
        """
        super().__init__()
        self.batch_size = batch_size

    def setup(self, stage: str) -> None:
        if hasattr(self, "train_set"):
            return
        fixed = torch.Generator().manual_seed(1936)
        centres = torch.tensor([[5.0, 3.4, 1.5, 0.2], [5.9, 2.8, 4.3, 1.3], [6.6, 3.0, 5.6, 2.0]])
        labels = torch.arange(3).repeat_interleave(50)
        data = centres[labels] + 0.45 * torch.randn(150, 4, generator=fixed)
        dataset = TensorDataset(data, labels)
        # The global generator decides the split (and the model the initial weights), so the seed matters.
        train, self.val_set = random_split(dataset, [130, 20])
        self.train_set, self.test_set = random_split(train, [110, 20])

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.train_set, batch_size=self.batch_size)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val_set, batch_size=self.batch_size)

    def test_dataloader(self) -> DataLoader:
        return DataLoader(self.test_set, batch_size=self.batch_size)


def cli_main() -> dict:
    early_stopping = EarlyStopping(monitor="val_loss")
    checkpoint_callback = ModelCheckpoint(
        dirpath=os.getcwd(), save_top_k=1, verbose=True, monitor="val_loss", mode="min"
    )
    lr_logger = LearningRateMonitor()
    cli = LightningCLI(
        IrisClassification,
        IrisDataModule,
        run=False,
        save_config_callback=None,
        trainer_defaults={
            "callbacks": [early_stopping, checkpoint_callback, lr_logger],
            "max_epochs": 4,
            "enable_progress_bar": False,
            "enable_model_summary": False,
        },
    )
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    fitted = {name: float(value) for name, value in cli.trainer.callback_metrics.items()}
    tested = cli.trainer.test(ckpt_path="best", datamodule=cli.datamodule)
    return {
        "test": tested,
        "fit": fitted,
        "global_step": cli.trainer.global_step,
        "hidden": cli.model.hparams.hidden,
        "callbacks": sorted(type(c).__name__ for c in cli.trainer.callbacks),
    }


if __name__ == "__main__":
    torch.save(cli_main(), OUT)
