"""The random numbers a module draws after ``seed_everything``, on Lightning or on drivetrain.

``python seeded_random_numbers.py lightning OUT.json`` (the peers' interpreter) records, per case,
what every training step draws from torch, Python and NumPy, the batch it trained on, and the
first draw after ``fit`` and after ``test``; the test runs the same cases on drivetrain and
compares. Only the imports differ.
"""

from __future__ import annotations

import json
import random
import sys
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

#: (name, the training loader's settings, with validation)
CASES: tuple[tuple[str, dict[str, Any], bool], ...] = (
    ("in_order", {}, False),
    ("in_order_validated", {}, True),
    ("shuffled", {"shuffle": True}, False),
    ("shuffled_validated", {"shuffle": True}, True),
    ("own_generator", {"shuffle": True, "generator": 3}, True),
)


def run_all(name: str) -> dict[str, Any]:
    if name == "lightning":
        import lightning.pytorch as framework
        from lightning.pytorch import seed_everything

        base = framework.LightningModule
    else:
        import drivetrain as framework
        from drivetrain import seed_everything

        base = framework.TrainingModule

    class Draws(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__()
            self.layer = nn.Linear(2, 1)
            self.drawn: list[list[float]] = []

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            self.drawn.append(
                [torch.rand(1).item(), random.random(), float(np.random.rand()), batch[0][0, 0].item()]
            )
            return self.layer(batch[0]).sum()

        def validation_step(self, batch: Any, batch_idx: int) -> None:
            self.log(
                "noise", torch.rand(1).item()
            )  # the sanity check's draws leave no trace, as in Lightning

        def test_step(self, batch: Any, batch_idx: int) -> None:
            pass

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    def run(settings: dict[str, Any], validated: bool) -> dict[str, Any]:
        seed_everything(0)
        data = TensorDataset(torch.arange(16.0).reshape(8, 2))
        if "generator" in settings:
            settings = {**settings, "generator": torch.Generator().manual_seed(settings["generator"])}
        module = Draws()
        trainer = framework.Trainer(
            accelerator="cpu",
            devices=1,
            max_epochs=2,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
        )
        trainer.fit(
            module,
            DataLoader(data, batch_size=2, **settings),
            DataLoader(data, batch_size=2) if validated else None,
        )
        after_fit = torch.rand(1).item()
        trainer.test(module, DataLoader(data, batch_size=2), verbose=False)
        return {"steps": module.drawn, "after_fit": after_fit, "after_test": torch.rand(1).item()}

    return {case: run(settings, validated) for case, settings, validated in CASES}


if __name__ == "__main__":
    found = run_all(sys.argv[1])
    with open(sys.argv[2], "w") as out:
        json.dump(found, out)
