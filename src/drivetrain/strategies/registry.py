"""The strategy registry: named presets such as ``"ddp"``, ``"ddp_spawn"`` or ``"deepspeed_stage_3_offload"``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from drivetrain._utilities.registry import Registry
from drivetrain.strategies.retired_names import RETIRED_STRATEGY_NAMES

if TYPE_CHECKING:
    from drivetrain.strategies.strategy import Strategy  # noqa: F401 - used in the string annotation below

    pass


class _StrategyRegistry(Registry["Strategy"]):
    def available_strategies(self) -> list[str]:
        """The registered strategy names (as Lightning users call it)."""
        return self.available()


StrategyRegistry = _StrategyRegistry(
    "strategy",
    entry_point_group="drivetrain.strategies",
    # Imported on the first lookup: the sharded and XLA strategies are not needed to import drivetrain.
    builtin_modules=(
        "drivetrain.strategies.single_device",
        "drivetrain.strategies.ddp",
        "drivetrain.strategies.fsdp",
        "drivetrain.strategies.model_parallel",
        "drivetrain.strategies.deepspeed",
        "drivetrain.strategies.xla",
        "drivetrain.strategies.single_xla",
        "drivetrain.strategies.hpu",
    ),
    retired=RETIRED_STRATEGY_NAMES,
)
"""The module-level strategy registry.

``StrategyRegistry.register("ddp_custom_checkpoint_io", DDPStrategy, description=...,
checkpoint_io=custom_io)`` makes ``strategy="ddp_custom_checkpoint_io"`` work everywhere.
"""
