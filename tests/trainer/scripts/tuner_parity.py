"""One small program with the Tuner (lr_find, scale_batch_size), on Lightning or on drivetrain.

``python tuner_parity.py lightning OUT.pt`` (the peers' interpreter) saves the range test's rates, losses and
suggestion, and the batch sizes found; the test runs the same program on drivetrain and compares. Only the
imports differ.
"""

from __future__ import annotations

import sys
import tempfile
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def _framework(name: str) -> tuple[Any, Any]:
    if name == "lightning":
        import lightning.pytorch as framework
        from lightning.pytorch.tuner import Tuner
    else:
        import drivetrain as framework
        from drivetrain import Tuner
    return framework, Tuner


def run_all(name: str) -> dict[str, Any]:
    framework, tuner_class = _framework(name)
    base = framework.LightningModule if name == "lightning" else framework.TrainingModule
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(256, 4, generator=generator)
    data = TensorDataset(
        x, x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]]) + 0.1 * torch.randn(256, 1, generator=generator)
    )

    class Net(base):  # type: ignore[misc, valid-type]
        def __init__(self, fail_above: int = 10**9) -> None:
            super().__init__()
            self.lr = 0.01
            self.batch_size = 8
            self.fail_above = fail_above
            self.net = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 1))

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            inputs, targets = batch
            if len(inputs) > self.fail_above:
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
            return nn.functional.mse_loss(self.net(inputs), targets)

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=self.lr)

        def train_dataloader(self) -> DataLoader:
            return DataLoader(data, batch_size=self.batch_size)

    def trainer(root: str) -> Any:
        return framework.Trainer(
            accelerator="cpu",
            devices=1,
            max_epochs=1,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            default_root_dir=root,
        )

    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as root:
        for mode, threshold in (("exponential", 4.0), ("linear", None)):
            torch.manual_seed(1)
            model = Net()
            finder = tuner_class(trainer(root)).lr_find(
                model, min_lr=1e-4, max_lr=3.0, num_training=60, mode=mode, early_stop_threshold=threshold
            )
            results[f"lr_find_{mode}"] = {
                "lr": finder.results["lr"],
                "loss": finder.results["loss"],
                "suggestion": finder.suggestion(),
                "attribute": model.lr,
            }
        for mode in ("power", "binsearch"):
            model = Net(fail_above=40)
            found = tuner_class(trainer(root)).scale_batch_size(model, mode=mode, init_val=3)
            results[f"scale_{mode}"] = {"found": found, "attribute": model.batch_size}
    return results


if __name__ == "__main__":
    torch.save(run_all(sys.argv[1]), sys.argv[2])
