"""Lightning 1.5's ``Accelerator(precision_plugin=, training_type_plugin=)`` met at the Accelerate-style door.

In Lightning 1.5 a (hardware) accelerator held the precision and training-type plugins; since 1.6
the strategy owns them. ``drivetrain.Accelerator`` is Accelerate's training-loop class, which takes
the precision and the strategy directly: the error says so, with the call to make.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from drivetrain._utilities.retired import Explanation


def _lightning_plugins(owner: str, kwargs: Mapping[str, Any]) -> str:
    given = ", ".join(f"{name}=..." for name in kwargs if name in _ARGUMENTS)
    return (
        f"{owner}({given}) is Lightning 1.5's way to attach plugins to a hardware accelerator; since Lightning 1.6 "
        f"the strategy owns them (training-type plugins became strategies). drivetrain.Accelerator takes them "
        f"directly: {owner}(precision=CustomPrecision(), strategy=CustomStrategy()), or "
        f"strategy=CustomStrategy(precision_plugin=CustomPrecision())."
    )


_ARGUMENTS: dict[str, Explanation] = {
    "precision_plugin": _lightning_plugins,
    "training_type_plugin": _lightning_plugins,
}
RETIRED_ACCELERATOR_ARGUMENTS: Mapping[str, Explanation] = _ARGUMENTS
"""Keyword arguments of Lightning 1.5's accelerators and the message each gets."""
