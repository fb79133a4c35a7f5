"""Settings that ``drivetrain launch`` hands to the processes it starts, read here and nowhere else.

``drivetrain launch --accelerator xpu script.py`` cannot resolve ``"xpu"`` itself when the script
registers that name, so it passes the name on and :func:`drivetrain.connect` resolves it inside
the script, after the script's own registrations ran. The same way, ``--mixed_precision`` (or
``--precision``) and ``--gradient_accumulation_steps`` reach the script's ``Accelerator`` or
``Trainer`` as their defaults: an argument the script passes explicitly wins (with a warning
when the two disagree).
"""

from __future__ import annotations

import os
import warnings

ACCELERATOR_VARIABLE = "DRIVETRAIN_ACCELERATOR"
PRECISION_VARIABLE = "DRIVETRAIN_PRECISION"
ACCUMULATION_VARIABLE = "DRIVETRAIN_GRADIENT_ACCUMULATION_STEPS"


def _value(name: str) -> str | None:
    value = os.environ.get(name, "").strip()
    return value or None


def launched_accelerator() -> str | None:
    """The accelerator name ``drivetrain launch --accelerator`` asked for, if any."""
    return _value(ACCELERATOR_VARIABLE)


def launched_precision() -> str | None:
    """The precision ``drivetrain launch --mixed_precision``/``--precision`` asked for, if any."""
    return _value(PRECISION_VARIABLE)


def launched_accumulation_steps() -> int | None:
    """The batches per optimizer step ``drivetrain launch --gradient_accumulation_steps`` asked for, if any.

    Raises:
        ValueError: the variable holds something other than a positive integer.
    """
    value = _value(ACCUMULATION_VARIABLE)
    if value is None:
        return None
    if not value.isdigit() or int(value) < 1:
        raise ValueError(
            f"{ACCUMULATION_VARIABLE}={value!r} must be a positive integer (the batches per optimizer step); "
            f"fix or unset it (drivetrain launch --gradient_accumulation_steps N sets it)."
        )
    return int(value)


def accumulation_steps(given: int | None, setting: str) -> int | None:
    """The batches per optimizer step: ``given`` (the script's ``setting``) if set, else the launcher's.

    Returns ``None`` when neither says (the caller's default applies). A launcher value that
    disagrees with the script's is reported with a warning: the script's wins.
    """
    launched = launched_accumulation_steps()
    if given is None:
        return launched
    if launched is not None and launched != given:
        warnings.warn(
            f"drivetrain launch (the {ACCUMULATION_VARIABLE} variable) asks for {launched} batches per optimizer "
            f"step, but the script sets {setting}={given}; the script's setting is used. Drop one of them.",
            UserWarning,
            stacklevel=3,
        )
    return given
