"""Precision names: the canonical ones, the spellings that map onto them, and the registry.

The canonical names are Lightning's current ones (``"bf16-mixed"`` …). Users arriving from
Accelerate write ``mixed_precision="fp16"``, and older Lightning code ``precision=16``; both
spellings are accepted and mean exactly the canonical name they map to, so a string means the
same thing through every front door.
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Mapping
from typing import Any

from drivetrain._utilities.registry import Registry, did_you_mean
from drivetrain.plugins.precision.amp import MixedPrecision
from drivetrain.plugins.precision.double import DoublePrecision
from drivetrain.plugins.precision.fp8 import Float8Precision
from drivetrain.plugins.precision.half import HalfPrecision
from drivetrain.plugins.precision.precision import Precision

CANONICAL_PRECISIONS: tuple[str, ...] = (
    "64-true",
    "32-true",
    "16-mixed",
    "bf16-mixed",
    "16-true",
    "bf16-true",
    "fp8",
)

#: Other accepted spellings → the canonical name they mean.
PRECISION_ALIASES: dict[str | int, str] = {
    # Accelerate's ``mixed_precision`` values.
    "no": "32-true",
    "fp16": "16-mixed",
    "bf16": "bf16-mixed",
    # Lightning's legacy values, as ints or strings.
    64: "64-true",
    32: "32-true",
    16: "16-mixed",
    "64": "64-true",
    "32": "32-true",
    "16": "16-mixed",
    "fp32": "32-true",
    "fp64": "64-true",
}

PrecisionRegistry: Registry[Precision] = Registry("precision", entry_point_group="drivetrain.precision")
PrecisionRegistry.register("64-true", DoublePrecision, description="float64 weights, inputs and compute")
PrecisionRegistry.register("32-true", Precision, description="float32 throughout (the default)")
PrecisionRegistry.register(
    "16-mixed",
    MixedPrecision,
    description="float16 autocast, float32 weights, loss scaling",
    precision="16-mixed",
)
PrecisionRegistry.register(
    "bf16-mixed", MixedPrecision, description="bfloat16 autocast, float32 weights", precision="bf16-mixed"
)
PrecisionRegistry.register(
    "16-true", HalfPrecision, description="float16 weights, inputs and compute", precision="16-true"
)
PrecisionRegistry.register(
    "bf16-true", HalfPrecision, description="bfloat16 weights, inputs and compute", precision="bf16-true"
)
PrecisionRegistry.register(
    "fp8",
    Float8Precision,
    description="float8 linear layers (torchao, drivetrain[fp8]; CUDA compute capability 8.9+), bfloat16 autocast",
)


def _accepted_spellings() -> str:
    """Each name once, then the other spellings grouped by the name they mean, then user-registered names."""
    by_name: dict[str, list[str]] = {}
    for alias, name in PRECISION_ALIASES.items():
        by_name.setdefault(name, []).append(repr(alias))
    others = ", ".join(f"{'/'.join(aliases)} for {name!r}" for name, aliases in by_name.items())
    text = f"{', '.join(map(repr, CANONICAL_PRECISIONS))} (also {others})"
    registered = [name for name in PrecisionRegistry.available() if name not in CANONICAL_PRECISIONS]
    if registered:
        text += f", or a registered one: {', '.join(map(repr, registered))}"
    return text


def _closest(value: object) -> str:
    spellings = [*CANONICAL_PRECISIONS, *(a for a in PRECISION_ALIASES if isinstance(a, str))]
    return did_you_mean(value, [*spellings, *PrecisionRegistry.available()])


def canonical_precision(value: str | int) -> str:
    """The canonical name for a precision spelling: ``"fp16"`` and ``16`` → ``"16-mixed"``.

    Raises:
        TypeError: if ``value`` is neither a string nor an int (``True`` is not a precision).
        ValueError: for a string or int that names no precision; the message lists the accepted ones.
    """
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise TypeError(
            f"A precision is given as a string such as 'bf16-mixed' (or Lightning's legacy ints 64, 32, "
            f"16), got {value!r} of type {type(value).__name__}. Pass a Precision instance to the "
            f"strategy if you built one yourself."
        )
    if value in CANONICAL_PRECISIONS:
        return value
    canonical = PRECISION_ALIASES.get(value)
    if canonical is None:
        raise ValueError(f"Unknown precision {value!r}.{_closest(value)} Accepted: {_accepted_spellings()}.")
    return canonical


def precision_from_name(
    value: str | int, device_type: str, options: Mapping[str, Any] | None = None
) -> Precision:
    """Build the precision plugin a name stands for, for hardware of ``device_type``.

    ``value`` may be a canonical name, an accepted spelling (see :func:`canonical_precision`) or
    a name registered in :data:`PrecisionRegistry` by a user or a plugin package. ``device_type``
    (``"cuda"``, ``"cpu"`` …) reaches only the plugins whose constructor takes ``device``.
    ``options`` are further constructor arguments (``scaler_kwargs`` …); one the plugin does not
    take has no effect, and a warning says so.

    Raises:
        TypeError: if ``value`` is neither a string nor an int.
        ValueError: for an unknown name, or a precision the device cannot run (from the plugin).
    """
    if isinstance(value, str) and value in PrecisionRegistry:
        name = value
    else:
        try:
            name = canonical_precision(value)
        except ValueError:
            raise ValueError(
                f"Unknown precision {value!r}.{_closest(value)} Accepted: {_accepted_spellings()}. Register your "
                f"own with PrecisionRegistry.register(name, cls)."
            ) from None
    entry = PrecisionRegistry.entry(name)
    parameters = inspect.signature(entry.cls).parameters
    overrides: dict[str, Any] = {}
    if "device" in parameters:
        overrides["device"] = device_type
    for option, setting in (options or {}).items():
        if option in parameters and option not in ("self", "device", "precision"):
            overrides[option] = setting
        else:
            warnings.warn(
                f"The precision option {option}={setting!r} has no effect: precision {name!r} "
                f"({entry.cls.__name__}) does not take it.",
                UserWarning,
                stacklevel=3,
            )
    return PrecisionRegistry.get(name, **overrides)
