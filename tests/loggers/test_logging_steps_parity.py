"""The x-axis of logged rows is Lightning's, so a migrated project's dashboards line up.

The same program (scripts/logging_steps.py) runs on Lightning (the peers' environment, as an
oracle) and on drivetrain; every row of metrics.csv must have the same step, epoch and names.
TensorBoard and MLflow receive the steps the CSV logger does (the Trainer sends every logger the
same row).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from helpers import peers
from helpers.peers import lightning_results_file

SCRIPT = Path(__file__).parent / "scripts" / "logging_steps.py"


def _drivetrain_rows() -> dict[str, Any]:
    return peers.drivetrain_results(SCRIPT)


@pytest.mark.timeout(400)
def test_every_logged_row_has_lightnings_step_and_epoch(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> None:
    theirs: dict[str, Any] = torch.load(
        lightning_results_file(SCRIPT, "logging-steps", request, tmp_path_factory), weights_only=True
    )
    ours = _drivetrain_rows()
    assert ours.keys() == theirs.keys()
    for case, rows in theirs.items():
        assert ours[case] == rows, f"{case}: (step, epoch, names) differ from Lightning's"
    # What the issue saw: the 4th, 8th … optimizer steps' rows at 3, 7 …, the epoch's row at 9.
    assert [row[0] for row in ours["plain"][:4]] == [3, 7, 9, 9]


def test_tensorboard_and_mlflow_get_the_csv_loggers_steps(tmp_path: Path, mlflow_dir: Path) -> None:
    pytest.importorskip("tensorboard")
    from mlflow.tracking import MlflowClient
    from tensorboard.backend.event_processing import event_accumulator
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    import drivetrain as dt
    from drivetrain.loggers import CSVLogger, MLFlowLogger, TensorBoardLogger

    class Net(dt.TrainingModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = nn.Linear(4, 1)

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            loss = nn.functional.mse_loss(self.layer(batch[0]), batch[1])
            self.log("train_loss", loss, on_step=True, on_epoch=True)
            return loss

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    x = torch.randn(40, 4, generator=torch.Generator().manual_seed(0))
    csv_logger = CSVLogger(tmp_path)
    tensorboard = TensorBoardLogger(tmp_path)
    mlflow = MLFlowLogger(save_dir=str(mlflow_dir))
    trainer = dt.Trainer(
        accelerator="cpu",
        max_epochs=2,
        log_every_n_steps=4,
        logger=[csv_logger, tensorboard, mlflow],
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
    )
    trainer.fit(Net(), DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=4))
    steps = {"train_loss_step": [3, 7, 11, 15, 19], "train_loss_epoch": [9, 19]}
    accumulator = event_accumulator.EventAccumulator(tensorboard.log_dir)
    accumulator.Reload()
    client = MlflowClient(tracking_uri=mlflow.tracking_uri)
    for name, expected in steps.items():
        assert [event.step for event in accumulator.Scalars(name)] == expected, name
        assert [m.step for m in client.get_metric_history(mlflow.run_id, name)] == expected, name
