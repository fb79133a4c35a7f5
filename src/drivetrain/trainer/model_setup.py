"""Putting the module on the strategy: the Trainer's part around the core's one set-up order.

The order itself (shared-memory copies, precision, device, optimizers on the *unwrapped* module,
one ``strategy.setup_module_and_optimizers`` call) is
:func:`drivetrain.strategies.model_setup.setup_model`, which the Accelerator calls too. The
Trainer adds what is its own: ``configure_model()`` layers built inside
``strategy.module_init_context`` first, optimizers from ``configure_optimizers()``, and schedulers
re-pointed at optimizers the strategy replaced.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from torch import nn
from torch.optim import Optimizer

from drivetrain._utilities.log import get_logger
from drivetrain.strategies.model_setup import setup_model as setup_on_strategy
from drivetrain.strategies.sync_batchnorm import convert_sync_batchnorm
from drivetrain.trainer.hooks import overrides
from drivetrain.trainer.module import TrainingModule
from drivetrain.trainer.optimizers import LRSchedulerConfig, parse_configure_optimizers

if TYPE_CHECKING:
    from drivetrain.trainer.run_state import RunState
    from drivetrain.trainer.trainer import Trainer


def setup_model(
    trainer: Trainer, run: RunState, with_optimizers: bool, restoring: bool
) -> tuple[nn.Module, list[Any], list[LRSchedulerConfig]]:
    """Return ``(model to call, optimizers, scheduler configs)`` for this process."""

    strategy = trainer.strategy
    module = run.module
    if overrides(module, TrainingModule, "configure_model"):
        # Weights about to be overwritten by a checkpoint need no initialisation.
        with strategy.module_init_context(empty_init=True if restoring else None):
            module.configure_model()
    if run.features.sync_batchnorm:
        _sync_batchnorm(trainer, module)
    if restoring and not strategy.requires_joint_setup:
        # Lightning's order: on_load_checkpoint and the weights before configure_optimizers (joint set-ups
        # restore after the strategy's set-up instead).
        from drivetrain.trainer.checkpointing import restore_module_and_callbacks

        restore_module_and_callbacks(trainer, run, module)
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
    built: list[Optimizer] = []
    schedulers: list[LRSchedulerConfig] = []

    def configure_optimizers() -> list[Optimizer]:
        # The core calls this once the module is converted and placed, before wrapping it.
        where = f"{type(module).__name__}.configure_optimizers()"
        try:
            returned = module.configure_optimizers()
        except ValueError as error:
            if "empty parameter list" not in str(error) or any(True for _ in module.parameters()):
                raise
            raise ValueError(
                f"{where} built an optimizer over no parameters: {type(module).__name__} has none (nothing to "
                f"train). Create its layers in __init__ as attributes (self.layer = nn.Linear(...)) or in "
                f"configure_model(); a module with nothing to train is run with validate, test or predict, not fit."
            ) from None
        optimizers, configs = parse_configure_optimizers(
            returned, where, automatic=module.automatic_optimization
        )
        _check_optimizers_train_the_module(module, optimizers, where)
        built.extend(optimizers)
        schedulers.extend(configs)
        return built

    model, set_up = setup_on_strategy(strategy, module, configure_optimizers if with_optimizers else ())
    for before, after in zip(built, set_up):
        if after is not before:
            for config in schedulers:
                if config.scheduler.optimizer is before:
                    config.scheduler.optimizer = after
    return model, set_up, schedulers


def _check_optimizers_train_the_module(module: nn.Module, optimizers: list[Optimizer], where: str) -> None:
    """Refuse an optimizer none of whose parameters is the module's: fit would run and change nothing.

    Once per fit, at set-up (a set of ids).
    """
    own = {id(parameter) for parameter in module.parameters()}
    if not own:
        return
    for optimizer in optimizers:
        held = [p for group in optimizer.param_groups for p in group["params"]]
        if held and not any(id(p) in own for p in held):
            raise ValueError(
                f"{where} returned {type(optimizer).__name__} over {len(held)} parameter(s), none of which belongs "
                f"to {type(module).__name__}: training would not change the module's weights. Build the optimizer "
                f"over the module's own parameters (torch.optim.SGD(self.parameters(), lr=...)), not over a "
                f"module created inside configure_optimizers or elsewhere."
            )


def _sync_batchnorm(trainer: Trainer, module: nn.Module) -> None:
    """``Trainer(sync_batchnorm=True)``: batch norms share their statistics across the processes."""

    strategy = trainer.strategy
    if strategy.world_size == 1:
        get_logger(__name__).info(
            "Trainer(sync_batchnorm=True) has no other process to synchronise with; the batch norms stay as they are."
        )
        return
    convert_sync_batchnorm(module, strategy.root_device.type)
