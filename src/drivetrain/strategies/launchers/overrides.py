"""Settings that ``drivetrain launch`` hands to the processes it starts, read here and nowhere else.

``drivetrain launch --accelerator xpu script.py`` cannot resolve ``"xpu"`` itself when the script
registers that name, so it passes the name on and :func:`drivetrain.connect` resolves it inside
the script, after the script's own registrations ran. The same way, ``--mixed_precision`` (or
``--precision``) and ``--gradient_accumulation_steps`` reach the script's ``Accelerator`` or
``Trainer`` as their defaults: an argument the script passes explicitly wins (with a warning
when the two disagree).

Accelerate's own variables (``ACCELERATE_MIXED_PRECISION``, ``ACCELERATE_USE_CPU`` …), which
migrated job templates and ``accelerate launch`` set, are read here too, for
``drivetrain.Accelerator`` (:func:`accelerate_variables`).
"""

from __future__ import annotations

import dataclasses
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


# -- Accelerate's launcher variables (read by drivetrain.Accelerator) ---------------------------
#: The ``ACCELERATE_*`` variables ``drivetrain.Accelerator`` honours (``accelerate launch`` sets them).
HONOURED_ACCELERATE_VARIABLES = (
    "ACCELERATE_MIXED_PRECISION",
    "ACCELERATE_GRADIENT_ACCUMULATION_STEPS",
    "ACCELERATE_USE_CPU",
    "ACCELERATE_DEBUG_MODE",
    "ACCELERATE_DYNAMO_BACKEND",
    "ACCELERATE_DYNAMO_MODE",
    "ACCELERATE_DYNAMO_USE_FULLGRAPH",
    "ACCELERATE_DYNAMO_USE_DYNAMIC",
)
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off", "")


@dataclasses.dataclass(frozen=True)
class AccelerateVariables:
    """What Accelerate's environment variables ask of an Accelerator (``None``: not set)."""

    mixed_precision: str | None = None
    gradient_accumulation_steps: int | None = None
    use_cpu: bool | None = None
    debug_mode: bool | None = None
    dynamo_backend: str | None = None
    dynamo_mode: str | None = None
    dynamo_use_fullgraph: bool | None = None
    dynamo_use_dynamic: bool | None = None


def accelerate_variables() -> AccelerateVariables:
    """Read the ``ACCELERATE_*`` variables a migrated job template or ``accelerate launch`` sets.

    The Accelerator takes them as defaults; its explicit arguments win. Any other ``ACCELERATE_*``
    variable that is set to something other than an "off" value gets a warning naming it, so a
    setting drivetrain does not read is never dropped silently.

    Raises:
        ValueError: a variable holds a value it cannot have.
    """
    precision = _value("ACCELERATE_MIXED_PRECISION")
    if precision is not None and precision.lower() not in ("no", "fp16", "bf16", "fp8"):
        raise ValueError(
            f"ACCELERATE_MIXED_PRECISION={precision!r} is not supported; use 'no', 'fp16', 'bf16' or 'fp8' (or unset it "
            f"and pass drivetrain.Accelerator(precision=...))."
        )
    steps = _value("ACCELERATE_GRADIENT_ACCUMULATION_STEPS")
    if steps is not None and (not steps.isdigit() or int(steps) < 1):
        raise ValueError(
            f"ACCELERATE_GRADIENT_ACCUMULATION_STEPS={steps!r} must be a positive integer (the batches per "
            f"optimizer step); fix or unset it."
        )
    ignored = sorted(
        name
        for name, value in os.environ.items()
        if name.startswith("ACCELERATE_")
        and name not in HONOURED_ACCELERATE_VARIABLES
        and value.strip().lower() not in _FALSE
    )
    if ignored:
        warnings.warn(
            f"{', '.join(f'{name}={os.environ[name]!r}' for name in ignored)}: drivetrain.Accelerator does not read "
            f"{'this variable' if len(ignored) == 1 else 'these variables'} (it reads "
            f"{', '.join(HONOURED_ACCELERATE_VARIABLES)}). Pass the setting to drivetrain.Accelerator(...) or "
            f"drivetrain launch, and unset the variable.",
            UserWarning,
            stacklevel=3,
        )
    return AccelerateVariables(
        mixed_precision=precision.lower() if precision is not None else None,
        gradient_accumulation_steps=int(steps) if steps is not None else None,
        use_cpu=_flag("ACCELERATE_USE_CPU"),
        debug_mode=_flag("ACCELERATE_DEBUG_MODE"),
        dynamo_backend=_value("ACCELERATE_DYNAMO_BACKEND"),
        dynamo_mode=_value("ACCELERATE_DYNAMO_MODE"),
        dynamo_use_fullgraph=_flag("ACCELERATE_DYNAMO_USE_FULLGRAPH"),
        dynamo_use_dynamic=_flag("ACCELERATE_DYNAMO_USE_DYNAMIC"),
    )


def warn_dynamo_unused_by_trainer() -> None:
    """The Trainer does not compile models: say so when ``--dynamo_backend`` / ``ACCELERATE_DYNAMO_BACKEND`` asks."""
    backend = _value("ACCELERATE_DYNAMO_BACKEND")
    if backend is not None and backend.lower() != "no":
        warnings.warn(
            f"ACCELERATE_DYNAMO_BACKEND={backend!r} (drivetrain launch --dynamo_backend) compiles the models of "
            f"drivetrain.Accelerator; the Trainer does not read it. Pass the compiled module instead "
            f"(trainer.fit(torch.compile(model, backend={backend.lower()!r}))), and drop the setting.",
            UserWarning,
            stacklevel=3,
        )


def _flag(name: str) -> bool | None:
    value = os.environ.get(name)
    if value is None:
        return None
    if value.strip().lower() in _TRUE:
        return True
    if value.strip().lower() in _FALSE:
        return False
    raise ValueError(f"{name}={value!r} is neither true nor false; set it to 1 or 0, or unset it.")
