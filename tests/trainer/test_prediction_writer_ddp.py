"""BasePredictionWriter under 2 real processes (gloo): each process writes its share, and the files
together hold every sample exactly once, with the dataset indices that name them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader

from drivetrain.trainer.callbacks import BasePredictionWriter
from helpers.multiprocess import run_processes
from trainer.trainer_models import Regression, quiet_trainer, regression_data

pytestmark = pytest.mark.multiprocess


class FileWriter(BasePredictionWriter):
    """Writes each batch (and, at the end, the whole share) of this process to its own files."""

    def __init__(self, folder: str) -> None:
        super().__init__(write_interval="batch_and_epoch")
        self.folder = Path(folder)

    def write_on_batch_end(
        self,
        trainer: Any,
        pl_module: Any,
        prediction: Any,
        batch_indices: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int,
    ) -> None:
        name = f"rank{trainer.global_rank}-batch{batch_idx}.pt"
        torch.save({"indices": batch_indices, "predictions": prediction}, self.folder / name)

    def write_on_epoch_end(self, trainer: Any, pl_module: Any, predictions: Any, batch_indices: Any) -> None:
        torch.save(
            {"indices": batch_indices, "predictions": predictions},
            self.folder / f"rank{trainer.global_rank}-epoch.pt",
        )


def _predict(rank: int, world: int, folder: str) -> int:
    torch.manual_seed(0)
    model = Regression()
    trainer = quiet_trainer(strategy="ddp", devices=2, callbacks=[FileWriter(folder)])
    # 21 samples in shuffled batches of 4: 6 batches dealt out, the last one short, no sample twice.
    data = DataLoader(regression_data(21, seed=3), batch_size=4, shuffle=True)
    assert trainer.predict(model, data, return_predictions=False) is None
    return trainer.global_rank


def test_prediction_files_of_two_processes_hold_every_sample_once(tmp_path: Path) -> None:
    assert sorted(run_processes(_predict, 2, args=(str(tmp_path),), timeout=90)) == [0, 1]
    torch.manual_seed(0)
    model = Regression()
    inputs = regression_data(21, seed=3).tensors[0]
    batch_files = sorted(tmp_path.glob("rank*-batch*.pt"))
    assert {path.name.split("-")[0] for path in batch_files} == {"rank0", "rank1"}  # both processes wrote
    indices: list[int] = []
    for path in batch_files:
        written = torch.load(path)
        indices += written["indices"]
        expected = model(inputs[written["indices"]]).detach()
        torch.testing.assert_close(written["predictions"], expected)  # the indices name the predicted items
    assert sorted(indices) == list(range(21))  # every sample exactly once
    epoch_indices: list[int] = []
    for rank in (0, 1):
        written = torch.load(tmp_path / f"rank{rank}-epoch.pt")
        assert len(written["predictions"]) == len(written["indices"])
        for batch, prediction in zip(written["indices"], written["predictions"]):
            torch.testing.assert_close(prediction, model(inputs[batch]).detach())
            epoch_indices += batch
    assert sorted(epoch_indices) == list(range(21))
