"""A Trainer(strategy="auto", devices=2) program for ``test_auto_strategy.py``.

    python auto_sizing_program.py WIDTH [LIMIT] [validate-first]

WIDTH sizes the model (16 → WIDTH → 1, Adam); LIMIT, when given and not "-", is passed as
``CPUAccelerator(memory_limit=LIMIT)`` (otherwise ``DRIVETRAIN_CPU_MEMORY_LIMIT`` is read);
``validate-first`` runs ``trainer.validate`` before ``fit`` (its processes then exist, so "auto"
keeps the DDP they run). Each
rank prints the strategy it trained with, the steps and a checksum of the trained weights.
"""

from __future__ import annotations

import sys

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import drivetrain as dt
from drivetrain.accelerators import CPUAccelerator


class Regression(dt.TrainingModule):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, width), nn.Tanh(), nn.Linear(width, 1))

    def training_step(self, batch, batch_idx):
        inputs, targets = batch
        return nn.functional.mse_loss(self.net(inputs), targets)

    def validation_step(self, batch, batch_idx):
        inputs, targets = batch
        self.log("val_loss", nn.functional.mse_loss(self.net(inputs), targets))

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-2)


def main() -> None:
    width = int(sys.argv[1])
    limit = sys.argv[2] if len(sys.argv) > 2 and sys.argv[2] != "-" else None
    accelerator = CPUAccelerator(memory_limit=limit) if limit else "cpu"
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(64, 16), torch.randn(64, 1))
    model = Regression(width)
    trainer = dt.Trainer(
        accelerator=accelerator,
        devices=2,
        strategy="auto",
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    if sys.argv[3:] == ["validate-first"]:
        trainer.validate(model, DataLoader(data, batch_size=8), verbose=False)
    trainer.fit(model, DataLoader(data, batch_size=8))
    state = trainer.strategy.get_module_state_dict(model)  # full weights on rank 0, also under FSDP
    checksum = (
        f"{sum(t.double().sum().item() for t in state.values()):.5f}" if trainer.global_rank == 0 else "-"
    )
    line = (
        f"rank={trainer.global_rank} strategy={type(trainer.strategy).__name__} steps={trainer.global_step}"
    )
    # One write per line: the ranks share stdout, and print() writes the text and its newline apart.
    sys.stdout.write(f"{line} sum={checksum}\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
