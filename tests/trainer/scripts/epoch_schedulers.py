"""When epoch-interval schedulers step, on Lightning or on drivetrain.

``python epoch_schedulers.py lightning OUT.json`` (the peers' interpreter) records the learning
rate each hook sees, per case; the test runs the same cases on drivetrain and compares. Only the
imports differ.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

#: (name, Trainer settings, ReduceLROnPlateau too, on_train_batch_start returns -1 at this batch of epoch 0)
CASES: tuple[tuple[str, dict[str, Any], bool, int | None], ...] = (
    ("max_steps_mid_epoch", {"max_steps": 6}, False, None),
    ("two_epochs_validated", {"max_epochs": 2}, False, None),
    ("plateau_after_epoch_end", {"max_epochs": 3}, True, None),
    ("plateau_max_steps_mid_epoch", {"max_steps": 6}, True, None),
    ("epoch_ended_by_the_module", {"max_epochs": 2}, True, 2),
)


def run_all(name: str) -> dict[str, Any]:
    if name == "lightning":
        import lightning.pytorch as framework

        base = framework.LightningModule
    else:
        import drivetrain as framework

        base = framework.TrainingModule

    def run(settings: dict[str, Any], plateau: bool, end_at: int | None) -> list[str]:
        seen: list[str] = []

        class Net(base):  # type: ignore[misc, valid-type]
            def __init__(self) -> None:
                super().__init__()
                self.layer = nn.Linear(2, 1)

            def lr(self) -> float:
                return float(self.trainer.optimizers[0].param_groups[0]["lr"])

            def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
                return self.layer(batch[0]).sum()

            def validation_step(self, batch: Any, batch_idx: int) -> None:
                pass

            def on_train_batch_start(self, batch: Any, batch_idx: int) -> Any:
                if end_at is not None and self.trainer.current_epoch == 0 and batch_idx == end_at:
                    return -1
                return None

            def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
                seen.append(f"batch_end {self.trainer.current_epoch}/{batch_idx}: {self.lr():.6g}")

            def on_validation_end(self) -> None:
                seen.append(f"validation_end {self.trainer.current_epoch}: {self.lr():.6g}")

            def on_train_epoch_end(self) -> None:
                self.log("constant", 1.0)  # never improves: the plateau scheduler halves after its patience
                seen.append(f"train_epoch_end {self.trainer.current_epoch}: {self.lr():.6g}")

            def on_train_end(self) -> None:
                seen.append(f"train_end: {self.lr():.6g}")

            def configure_optimizers(self) -> Any:
                optimizer = torch.optim.SGD(self.parameters(), lr=0.1)
                schedulers: list[Any] = [
                    {
                        "scheduler": torch.optim.lr_scheduler.StepLR(optimizer, 1, gamma=0.5),
                        "interval": "epoch",
                    }
                ]
                if plateau:
                    reduce = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, factor=0.1, patience=0)
                    schedulers.append({"scheduler": reduce, "monitor": "constant", "interval": "epoch"})
                return [optimizer], schedulers

        data = DataLoader(TensorDataset(torch.randn(8, 2)), batch_size=2)  # 4 batches
        trainer = framework.Trainer(
            accelerator="cpu",
            devices=1,
            num_sanity_val_steps=0,
            limit_val_batches=1,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            **settings,
        )
        torch.manual_seed(0)
        trainer.fit(Net(), data, data)
        return seen

    return {case: run(settings, plateau, end_at) for case, settings, plateau, end_at in CASES}


if __name__ == "__main__":
    found = run_all(sys.argv[1])
    with open(sys.argv[2], "w") as out:
        json.dump(found, out)
