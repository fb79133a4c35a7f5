"""What ``on_train_batch_end`` receives as ``outputs``, on Lightning or on drivetrain.

``python batch_end_outputs.py lightning OUT.pt`` (the peers' interpreter) saves, per case, the
``outputs["loss"]`` each batch-end hook saw and the loss ``training_step`` returned; the test runs
the same cases on drivetrain and compares. Only the imports differ.
"""

from __future__ import annotations

import sys
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

#: (name, accumulate_grad_batches, training_step returns a dict, optimizer_step overridden, 5 batches)
CASES = (
    ("tensor_1", 1, False, False),
    ("tensor_2", 2, False, False),
    ("dict_3", 3, True, False),
    ("general_2", 2, False, True),
    ("general_dict_3", 3, True, True),
)


def run_all(name: str) -> dict[str, Any]:
    if name == "lightning":
        import lightning.pytorch as framework
        from lightning.pytorch.callbacks import Callback

        base = framework.LightningModule
    else:
        import drivetrain as framework
        from drivetrain.trainer.callbacks import Callback

        base = framework.TrainingModule

    class Seen(Callback):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            self.losses: list[float] = []

        def on_train_batch_end(
            self, trainer: Any, module: Any, outputs: Any, batch: Any, batch_idx: int
        ) -> None:
            self.losses.append(float(outputs["loss"]))

    def run(accumulate: int, as_dict: bool, general: bool) -> dict[str, list[float]]:
        class Net(base):  # type: ignore[misc, valid-type]
            def __init__(self) -> None:
                super().__init__()
                self.layer = nn.Linear(4, 1)
                self.returned: list[float] = []
                self.module_seen: list[float] = []

            def training_step(self, batch: Any, batch_idx: int) -> Any:
                x, y = batch
                loss = nn.functional.mse_loss(self.layer(x), y)
                self.returned.append(float(loss.detach()))
                return {"loss": loss, "extra": 1} if as_dict else loss

            def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
                self.module_seen.append(float(outputs["loss"]))

            def configure_optimizers(self) -> Any:
                return torch.optim.SGD(self.parameters(), lr=0.1)

            if general:

                def optimizer_step(self, *args: Any, **kwargs: Any) -> None:
                    super().optimizer_step(*args, **kwargs)

        torch.manual_seed(0)
        net, seen = Net(), Seen()
        data = TensorDataset(torch.randn(20, 4), torch.randn(20, 1))
        trainer = framework.Trainer(
            max_epochs=1,
            accumulate_grad_batches=accumulate,
            callbacks=[seen],
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            accelerator="cpu",
            devices=1,
        )
        trainer.fit(net, DataLoader(data, batch_size=4))
        return {"returned": net.returned, "callback": seen.losses, "module": net.module_seen}

    return {case: run(accumulate, as_dict, general) for case, accumulate, as_dict, general in CASES}


if __name__ == "__main__":
    torch.save(run_all(sys.argv[1]), sys.argv[2])
