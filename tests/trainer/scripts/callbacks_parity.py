"""One small program with the averaging, fine-tuning and pruning callbacks, on Lightning or on drivetrain.

``python callbacks_parity.py lightning OUT.pt`` (the peers' interpreter) saves each case's final weights and
learning rates; the test runs the same cases on drivetrain and compares. Only the imports differ.
"""

from __future__ import annotations

import sys
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def _framework(name: str) -> Any:
    if name == "lightning":
        import lightning.pytorch as framework
        from lightning.pytorch import callbacks
    else:
        import drivetrain as framework
        from drivetrain.trainer import callbacks
    return framework, callbacks


def run_all(name: str) -> dict[str, Any]:
    framework, callbacks = _framework(name)
    base = framework.LightningModule if name == "lightning" else framework.TrainingModule

    class Net(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__()
            self.backbone = nn.Sequential(nn.Linear(4, 8), nn.Tanh())
            self.head = nn.Linear(8, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(self.backbone(x))

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            return nn.functional.mse_loss(self(x), y)

        def configure_optimizers(self) -> Any:
            trainable = [p for p in self.parameters() if p.requires_grad]
            return torch.optim.SGD(trainable, lr=0.05, momentum=0.5)

    class Rates(callbacks.Callback):  # type: ignore[misc, name-defined]
        def __init__(self) -> None:
            self.rates: list[list[float]] = []

        def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
            if batch_idx == 0:
                self.rates.append([group["lr"] for group in trainer.optimizers[0].param_groups])

    def run(callback: Any) -> dict[str, Any]:
        generator = torch.Generator().manual_seed(0)
        x = torch.randn(64, 4, generator=generator)
        data = DataLoader(TensorDataset(x, x.sum(1, keepdim=True).tanh()), batch_size=8)
        torch.manual_seed(0)
        model = Net()
        rates = Rates()
        trainer = framework.Trainer(
            accelerator="cpu",
            devices=1,
            max_epochs=5,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            num_sanity_val_steps=0,
            callbacks=[callback, rates],
        )
        trainer.fit(model, data)
        return {
            "weights": {k: v.detach().clone() for k, v in model.state_dict().items()},
            "rates": rates.rates,
        }

    return {
        "weight_averaging": run(callbacks.WeightAveraging()),
        "ema": run(callbacks.EMAWeightAveraging(decay=0.8, update_starting_at_step=3)),
        # The default lambda_func: Lightning 2.6's grows the backbone's rate twofold per epoch.
        "backbone": run(callbacks.BackboneFinetuning(unfreeze_backbone_at_epoch=2)),
        "pruning_global": run(
            callbacks.ModelPruning("l1_unstructured", amount=0.3, use_lottery_ticket_hypothesis=False)
        ),
        "pruning_local": run(
            callbacks.ModelPruning(
                "l1_unstructured",
                amount=0.5,
                parameter_names=["weight"],
                use_global_unstructured=False,
                use_lottery_ticket_hypothesis=False,
            )
        ),
        "swa": run(callbacks.StochasticWeightAveraging(swa_lrs=0.01, swa_epoch_start=2, annealing_epochs=3)),
    }


if __name__ == "__main__":
    torch.save(run_all(sys.argv[1]), sys.argv[2])
