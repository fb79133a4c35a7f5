"""Record the order in which a Trainer calls a module's hooks, with drivetrain or with Lightning.

The same program runs on either library, so the order drivetrain follows can be checked against
Lightning's own (run this file with a Python that has ``lightning`` installed)::

    python hook_order.py lightning 1     # prints the JSON list of hook names
    python hook_order.py drivetrain 2    # accumulate_grad_batches=2
    python hook_order.py lightning 2 fast   # the step hooks left alone (drivetrain's fast step path)
    python hook_order.py lightning callbacks  # module and callbacks together: fit, validate, test, predict, resume

Every hook is overridden and calls the base class, so the run behaves as if none were.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

#: Hooks recorded by name (the steps and set-up hooks are recorded by hand below).
HOOKS = (
    "optimizer_step", "optimizer_zero_grad", "configure_gradient_clipping", "lr_scheduler_step", "backward",
    "transfer_batch_to_device", "on_before_batch_transfer", "on_after_batch_transfer",
    "on_validation_model_eval", "on_validation_model_train", "on_test_model_eval", "on_test_model_train",
    "on_predict_model_eval", "on_fit_start", "on_fit_end", "on_train_start", "on_train_end",
    "on_train_epoch_start", "on_train_epoch_end", "on_train_batch_start", "on_train_batch_end",
    "on_validation_start", "on_validation_end", "on_validation_epoch_start", "on_validation_epoch_end",
    "on_validation_batch_start", "on_validation_batch_end", "on_test_start", "on_test_end",
    "on_predict_start", "on_predict_end", "on_before_backward", "on_after_backward",
    "on_before_optimizer_step", "on_before_zero_grad",
)  # fmt: skip


#: The step hooks whose override moves drivetrain's Trainer from its fast step path to the general one.
GENERAL_PATH_HOOKS = ("optimizer_step", "optimizer_zero_grad", "configure_gradient_clipping", "backward")


def record(library: str, accumulate: int = 1, fast_path: bool = False) -> list[str]:
    """Fit (2 batches, one sanity batch, clipping, a per-step scheduler), test and predict; the hooks called.

    ``fast_path``: leave the :data:`GENERAL_PATH_HOOKS` alone, so drivetrain takes its fast step path.
    """
    if library == "lightning":
        import lightning.pytorch as framework

        base, trainer_class = framework.LightningModule, framework.Trainer
    else:
        import drivetrain as framework

        base, trainer_class = framework.TrainingModule, framework.Trainer
    calls: list[str] = []

    def recorded(name: str) -> Any:
        def hook(self: Any, *args: Any, **kwargs: Any) -> Any:
            calls.append(name)
            return getattr(base, name)(self, *args, **kwargs)

        return hook

    class Recorder(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__()
            self.layer = nn.Linear(2, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.layer(x)

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            calls.append("training_step")
            return self(batch[0]).sum()

        def validation_step(self, batch: Any, batch_idx: int) -> None:
            calls.append("validation_step")

        def test_step(self, batch: Any, batch_idx: int) -> None:
            calls.append("test_step")

        def predict_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            calls.append("predict_step")
            return self(batch[0])

        def configure_optimizers(self) -> Any:
            calls.append("configure_optimizers")
            optimizer = torch.optim.SGD(self.parameters(), lr=0.1)
            scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 1)
            return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

        def configure_callbacks(self) -> list[Any]:
            calls.append("configure_callbacks")
            return []

        def prepare_data(self) -> None:
            calls.append("prepare_data")

        def setup(self, stage: str) -> None:
            calls.append(f"setup:{getattr(stage, 'value', stage)}")

        def teardown(self, stage: str) -> None:
            calls.append(f"teardown:{getattr(stage, 'value', stage)}")

    for name in HOOKS:
        if fast_path and name in GENERAL_PATH_HOOKS:
            continue
        setattr(Recorder, name, recorded(name))
    data = DataLoader(TensorDataset(torch.randn(4, 2)), batch_size=2)
    trainer = trainer_class(
        accelerator="cpu",
        devices=1,
        max_epochs=1,
        num_sanity_val_steps=1,
        gradient_clip_val=1.0,
        accumulate_grad_batches=accumulate,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        logger=False,
    )
    module = Recorder()
    trainer.fit(module, data, data)
    calls.append("--- test")
    trainer.test(module, data, verbose=False)
    calls.append("--- predict")
    trainer.predict(module, data)
    return calls


#: Callback hooks recorded (every hook both libraries' ``Callback`` has, the checkpoint ones included).
CALLBACK_HOOKS = (
    "setup", "teardown", "on_fit_start", "on_fit_end", "on_sanity_check_start", "on_sanity_check_end",
    "on_train_start", "on_train_end", "on_train_epoch_start", "on_train_epoch_end", "on_train_batch_start",
    "on_train_batch_end", "on_validation_start", "on_validation_end", "on_validation_epoch_start",
    "on_validation_epoch_end", "on_validation_batch_start", "on_validation_batch_end", "on_test_start",
    "on_test_end", "on_test_epoch_start", "on_test_epoch_end", "on_test_batch_start", "on_test_batch_end",
    "on_predict_start", "on_predict_end", "on_predict_epoch_start", "on_predict_epoch_end",
    "on_predict_batch_start", "on_predict_batch_end", "on_before_backward", "on_after_backward",
    "on_before_optimizer_step", "on_before_zero_grad", "on_save_checkpoint", "on_load_checkpoint",
)  # fmt: skip
#: Module hooks recorded beside the callbacks' (the same names, as far as the module has them).
MODULE_HOOKS = (
    "on_fit_start", "on_fit_end", "on_train_start", "on_train_end", "on_train_epoch_start", "on_train_epoch_end",
    "on_train_batch_start", "on_train_batch_end", "on_validation_start", "on_validation_end",
    "on_validation_epoch_start", "on_validation_epoch_end", "on_validation_batch_start", "on_validation_batch_end",
    "on_test_start", "on_test_end", "on_test_epoch_start", "on_test_epoch_end", "on_test_batch_start",
    "on_test_batch_end", "on_predict_start", "on_predict_end", "on_predict_epoch_start", "on_predict_epoch_end",
    "on_predict_batch_start", "on_predict_batch_end", "on_before_backward", "on_after_backward",
    "on_before_optimizer_step", "on_before_zero_grad", "on_save_checkpoint", "on_load_checkpoint",
)  # fmt: skip


def record_with_callbacks(library: str) -> list[str]:
    """Module and callback hooks, labelled ``who:hook``: fit (2 epochs of 2 batches, saving a checkpoint after
    each validation), validate, test, predict, then a fit resumed from the first epoch's checkpoint.

    Three callbacks take part: a plain one (``callback``), and subclasses of the monitoring callbacks
    ``EarlyStopping`` (``early_stopping``) and ``ModelCheckpoint`` (``checkpoint``), which Lightning calls
    after the module at ``on_train_epoch_end``.
    """
    import tempfile

    if library == "lightning":
        import lightning.pytorch as framework
        from lightning.pytorch.callbacks import Callback, EarlyStopping, ModelCheckpoint

        base, trainer_class = framework.LightningModule, framework.Trainer
    else:
        import drivetrain as framework
        from drivetrain.trainer.callbacks import Callback, EarlyStopping, ModelCheckpoint

        base, trainer_class = framework.TrainingModule, framework.Trainer
    calls: list[str] = []

    def recorded(who: str, name: str, parent: type) -> Any:
        def hook(self: Any, *args: Any, **kwargs: Any) -> Any:
            calls.append(f"{who}:{name}")
            return getattr(parent, name)(self, *args, **kwargs)

        return hook

    def recording(parent: type, who: str, names: tuple[str, ...]) -> type:
        return type(f"Recording{parent.__name__}", (parent,), {n: recorded(who, n, parent) for n in names})

    class Recorder(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__()
            self.layer = nn.Linear(2, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.layer(x)

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            calls.append("module:training_step")
            return self(batch[0]).sum()

        def validation_step(self, batch: Any, batch_idx: int) -> None:
            calls.append("module:validation_step")
            self.log("val_loss", self(batch[0]).sum())

        def test_step(self, batch: Any, batch_idx: int) -> None:
            calls.append("module:test_step")

        def predict_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            calls.append("module:predict_step")
            return self(batch[0])

        def configure_optimizers(self) -> Any:
            calls.append("module:configure_optimizers")
            return torch.optim.SGD(self.parameters(), lr=0.1)

        def setup(self, stage: str) -> None:
            calls.append(f"module:setup:{getattr(stage, 'value', stage)}")

        def teardown(self, stage: str) -> None:
            calls.append(f"module:teardown:{getattr(stage, 'value', stage)}")

    for name in MODULE_HOOKS:
        setattr(Recorder, name, recorded("module", name, base))
    folder = tempfile.mkdtemp()

    def trainer(max_epochs: int) -> Any:
        callbacks = [
            recording(Callback, "callback", CALLBACK_HOOKS)(),
            recording(EarlyStopping, "early_stopping", CALLBACK_HOOKS)(monitor="val_loss", patience=100),
            recording(ModelCheckpoint, "checkpoint", CALLBACK_HOOKS)(
                dirpath=folder, filename="{epoch}", save_top_k=-1
            ),
        ]
        return trainer_class(
            accelerator="cpu",
            devices=1,
            max_epochs=max_epochs,
            num_sanity_val_steps=1,
            callbacks=callbacks,
            enable_progress_bar=False,
            enable_model_summary=False,
            logger=False,
            default_root_dir=folder,
        )

    data = DataLoader(TensorDataset(torch.randn(4, 2)), batch_size=2)
    module = Recorder()
    calls.append("--- fit")
    trainer(2).fit(module, data, data)
    for stage in ("validate", "test"):
        calls.append(f"--- {stage}")
        getattr(trainer(1), stage)(module, data, verbose=False)
    calls.append("--- predict")
    trainer(1).predict(module, data)
    calls.append("--- resume")
    trainer(2).fit(Recorder(), data, data, ckpt_path=f"{folder}/epoch=0.ckpt")
    return calls


if __name__ == "__main__":
    if sys.argv[2:3] == ["callbacks"]:
        print(json.dumps(record_with_callbacks(sys.argv[1])))
    else:
        print(
            json.dumps(
                record(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 1, "fast" in sys.argv[3:])
            )
        )
