"""Which checkpoint files ``ModelCheckpoint`` keeps when a fit resumes, on Lightning or on drivetrain.

``python resume_pruning.py lightning OUT.json`` (the peers' interpreter) writes, per case, the
files left in each folder after a first fit and after a fit resumed from one of its checkpoints;
the test runs the same cases on drivetrain and compares. Only the imports differ.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def run_all(name: str) -> dict[str, Any]:
    if name == "lightning":
        import lightning.pytorch as framework
        from lightning.pytorch.callbacks import ModelCheckpoint

        base = framework.LightningModule
    else:
        import drivetrain as framework
        from drivetrain.trainer.callbacks import ModelCheckpoint

        base = framework.TrainingModule

    class Net(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__()
            self.layer = nn.Linear(2, 1)

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            # A score that grows with every step: with mode="max" the newest checkpoints are the best.
            self.log("score", float(self.trainer.global_step))
            return self.layer(batch[0]).sum()

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    data = DataLoader(TensorDataset(torch.randn(40, 2)), batch_size=2)

    def fit(folder: str, max_steps: int, ckpt_path: str | None = None, **settings: Any) -> None:
        callback = ModelCheckpoint(dirpath=folder, filename="{step}", every_n_train_steps=2, **settings)
        trainer = framework.Trainer(
            accelerator="cpu",
            devices=1,
            max_steps=max_steps,
            callbacks=[callback],
            logger=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            default_root_dir=folder,
        )
        torch.manual_seed(0)
        trainer.fit(Net(), data, ckpt_path=ckpt_path)

    def listing(folder: str) -> list[str]:
        return sorted(n for n in os.listdir(folder) if n.endswith(".ckpt")) if os.path.isdir(folder) else []

    root = tempfile.mkdtemp()
    results: dict[str, Any] = {}

    # The resumed-from checkpoint leaves the top k during the resumed fit.
    top_k = {"monitor": "score", "mode": "max", "save_top_k": 2, "save_last": True}
    folder = os.path.join(root, "top_k")
    fit(folder, 6, **top_k)
    first = listing(folder)
    fit(folder, 12, ckpt_path=os.path.join(folder, "step=6.ckpt"), **top_k)
    results["top_k"] = [first, listing(folder)]

    # The most recent one (no monitor), resumed with ckpt_path="last".
    recent = {"save_top_k": 1, "save_last": True}
    folder = os.path.join(root, "recent")
    fit(folder, 6, **recent)
    first = listing(folder)
    fit(folder, 12, ckpt_path="last", **recent)
    results["recent_last"] = [first, listing(folder)]

    # Resumed from another run's folder: nothing of that folder goes.
    other, mine = os.path.join(root, "other"), os.path.join(root, "mine")
    fit(other, 6, **recent)
    first = listing(other)
    fit(mine, 12, ckpt_path=os.path.join(other, "last.ckpt"), **recent)
    results["other_folder"] = [first, listing(other), listing(mine)]
    return results


if __name__ == "__main__":
    found = run_all(sys.argv[1])
    with open(sys.argv[2], "w") as out:
        json.dump(found, out)
