"""Putting the module on the strategy: deferred layers, precision, device, optimizers, wrapping.

The order is the core's contract (docs/core-api.md): build ``configure_model()`` layers inside
``strategy.module_init_context``; cast for the precision; move to the device; build the
optimizers on the *unwrapped* module; then one ``strategy.setup_module_and_optimizers`` call,
which wraps (DDP) or shards (FSDP, DeepSpeed) and re-points the optimizers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from torch import nn

from drivetrain.trainer.hooks import overrides
from drivetrain.trainer.optimizers import LRSchedulerConfig, parse_configure_optimizers

if TYPE_CHECKING:
    from drivetrain.trainer.trainer import Trainer


def setup_model(
    trainer: Trainer, with_optimizers: bool, restoring: bool
) -> tuple[nn.Module, list[Any], list[LRSchedulerConfig]]:
    """Return ``(model to call, optimizers, scheduler configs)`` for this process."""
    from drivetrain.trainer.module import TrainingModule

    strategy = trainer.strategy
    module = trainer._module
    unshare(module)
    if overrides(module, TrainingModule, "configure_model"):
        # Weights about to be overwritten by a checkpoint need no initialisation.
        with strategy.module_init_context(empty_init=True if restoring else None):
            module.configure_model()
    converted = strategy.precision.convert_module(module)
    if converted is not module:
        raise TypeError(
            f"{type(strategy.precision).__name__}.convert_module returned a new module; the Trainer needs the "
            f"module converted in place."
        )
    strategy.module_to_device(module)
    optimizers: list[Any] = []
    schedulers: list[LRSchedulerConfig] = []
    if with_optimizers:
        if not overrides(module, TrainingModule, "configure_optimizers"):
            raise ValueError(
                f"{type(module).__name__} does not define configure_optimizers(self), which fit() needs to know how to "
                f"update the weights. Return an optimizer from it, e.g. torch.optim.Adam(self.parameters(), lr=1e-3)."
            )
        if not overrides(module, TrainingModule, "training_step"):
            raise ValueError(
                f"{type(module).__name__} does not define training_step(self, batch, batch_idx), which fit() runs. "
                f"Define it to return the loss."
            )
        optimizers, schedulers = parse_configure_optimizers(
            module.configure_optimizers(), f"{type(module).__name__}.configure_optimizers()"
        )
    model, set_up = strategy.setup_module_and_optimizers(module, list(optimizers))
    for before, after in zip(optimizers, set_up):
        if after is not before:
            for config in schedulers:
                if config.scheduler.optimizer is before:
                    config.scheduler.optimizer = after
    return model, list(set_up), schedulers


def unshare(module: nn.Module) -> None:
    """Give this process its own copy of tensors that arrived in shared memory.

    torch.multiprocessing's spawn hands CPU tensors to the new processes through shared memory,
    so without this every rank (and the parent) would update one and the same set of weights.
    """
    for tensor in (*module.parameters(), *module.buffers()):
        if tensor.device.type == "cpu" and tensor.is_shared():
            tensor.data = tensor.data.clone()
