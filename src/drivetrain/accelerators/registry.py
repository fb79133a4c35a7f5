"""The accelerator registry: short names such as ``"cpu"``, ``"cuda"`` or a user's ``"xpu"``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from drivetrain._utilities.registry import Registry
from drivetrain.accelerators.retired_names import RETIRED_ACCELERATORS

if TYPE_CHECKING:
    from drivetrain.accelerators.accelerator import Accelerator  # noqa: F401 - used in the string annotation below

    pass


class _AcceleratorRegistry(Registry["Accelerator"]):
    def available_accelerators(self) -> list[str]:
        """The registered accelerator names (as Lightning users call it)."""
        return self.available()


AcceleratorRegistry = _AcceleratorRegistry(
    "accelerator",
    entry_point_group="drivetrain.accelerators",
    # Imported on the first lookup (or the first registration of a user's class).
    builtin_modules=(
        "drivetrain.accelerators.cpu",
        "drivetrain.accelerators.cuda",
        "drivetrain.accelerators.mps",
        "drivetrain.accelerators.xla",
        "drivetrain.accelerators.xpu",
        "drivetrain.accelerators.hpu",
    ),
    retired=RETIRED_ACCELERATORS,
)
"""The module-level accelerator registry."""
