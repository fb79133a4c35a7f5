"""The Trainer's loop settings, checked once when the Trainer is built.

Every check says what was given, what is allowed and how to fix it, so a typo in a long run's
configuration fails at ``Trainer(...)``, not hours later.
"""

from __future__ import annotations

import datetime
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from drivetrain.strategies.launchers.overrides import accumulation_steps, warn_dynamo_unused_by_trainer
from drivetrain.trainer.data_connector import check_limit

#: When neither max_epochs nor max_steps nor max_time is set.
DEFAULT_MAX_EPOCHS = 1000


@dataclass
class LoopSettings:
    """How long to train, how often to validate and log, and how each optimizer step is made."""

    max_epochs: int
    min_epochs: int
    max_steps: int
    max_time: datetime.timedelta | None
    limit_train_batches: int | float
    limit_val_batches: int | float
    limit_test_batches: int | float
    limit_predict_batches: int | float
    #: a fraction of an epoch (float), a number of batches (int), or wall time since the last validation
    val_check_interval: int | float | datetime.timedelta
    check_val_every_n_epoch: int | None
    num_sanity_val_steps: int
    accumulate_grad_batches: int
    gradient_clip_val: float | None
    #: as given (``None``: not set, clipping by norm), as Lightning passes it to ``configure_gradient_clipping``
    gradient_clip_algorithm: str | None
    log_every_n_steps: int
    fast_dev_run: int
    inference_mode: bool
    #: optimizer steps before a stop request (early stopping, ``should_stop``) is honoured.
    min_steps: int = 0


def _int(name: str, value: Any, minimum: int, extra: str = "") -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} expects an int, got {type(value).__name__} ({value!r}).{extra}")
    if value < minimum:
        raise ValueError(f"{name}={value} is not allowed; use an int >= {minimum}.{extra}")
    return value


def parse_max_time(value: Any, name: str = "max_time") -> datetime.timedelta | None:
    """``"DD:HH:MM:SS"``, a ``timedelta``, or a dict of ``timedelta`` arguments."""
    if value is None:
        return None
    if isinstance(value, datetime.timedelta):
        duration = value
    elif isinstance(value, str):
        match = re.fullmatch(r"(\d+):(\d{1,2}):(\d{1,2}):(\d{1,2})", value.strip())
        if not match:
            raise ValueError(
                f"{name}={value!r}; write it as 'DD:HH:MM:SS' (e.g. '00:12:00:00' for 12 hours)."
            )
        days, hours, minutes, seconds = map(int, match.groups())
        duration = datetime.timedelta(days=days, hours=hours, minutes=minutes, seconds=seconds)
    elif isinstance(value, Mapping):
        try:
            duration = datetime.timedelta(**value)
        except TypeError as error:
            raise ValueError(
                f"{name}={dict(value)!r}: {error}; use timedelta's keywords (days, hours, minutes, seconds)."
            ) from None
    else:
        raise TypeError(f"{name} expects 'DD:HH:MM:SS', a datetime.timedelta or a dict, got {value!r}.")
    if duration.total_seconds() < 0:
        raise ValueError(f"{name}={value!r} is negative; use a duration >= 0 (0: stop at the first check).")
    return duration


def build_settings(
    *,
    max_epochs: int | None,
    min_epochs: int | None,
    max_steps: int,
    min_steps: int | None = None,
    max_time: Any,
    limit_train_batches: int | float | None,
    limit_val_batches: int | float | None,
    limit_test_batches: int | float | None,
    limit_predict_batches: int | float | None,
    val_check_interval: int | float | str | datetime.timedelta | Mapping[str, Any] | None,
    check_val_every_n_epoch: int | None,
    num_sanity_val_steps: int | None,
    accumulate_grad_batches: int | None,
    gradient_clip_val: float | None,
    gradient_clip_algorithm: str | None,
    log_every_n_steps: int | None,
    fast_dev_run: int | bool,
    inference_mode: bool,
) -> LoopSettings:
    """Check every loop setting and apply ``fast_dev_run``."""
    max_steps = _int("max_steps", max_steps, -1, " Use -1 for no limit.")
    duration = parse_max_time(max_time)
    if max_epochs is None:
        max_epochs = DEFAULT_MAX_EPOCHS if max_steps == -1 and duration is None else -1
    max_epochs = _int("max_epochs", max_epochs, -1, " Use -1 to train until max_steps/max_time or a stop.")
    min_epochs = _int("min_epochs", 0 if min_epochs is None else min_epochs, 0)
    if max_epochs != -1 and min_epochs > max_epochs:
        raise ValueError(
            f"min_epochs={min_epochs} is more than max_epochs={max_epochs}; make min_epochs <= max_epochs."
        )
    min_steps = _int("min_steps", 0 if min_steps is None else min_steps, 0)
    if max_steps != -1 and min_steps > max_steps:
        raise ValueError(
            f"min_steps={min_steps} is more than max_steps={max_steps}; make min_steps <= max_steps."
        )
    if isinstance(fast_dev_run, bool):
        fast = 1 if fast_dev_run else 0
    else:
        fast = _int("fast_dev_run", fast_dev_run, 0, " Use True (one batch) or a number of batches.")
    limits = {
        name: check_limit(name, 1.0 if value is None else value)
        for name, value in (
            ("limit_train_batches", limit_train_batches),
            ("limit_val_batches", limit_val_batches),
            ("limit_test_batches", limit_test_batches),
            ("limit_predict_batches", limit_predict_batches),
        )
    }
    interval: Any = 1.0 if val_check_interval is None else val_check_interval
    if isinstance(interval, (str, datetime.timedelta, Mapping)):
        # Lightning 2.6's time-based validation: once this much wall time passed since the last one.
        interval = parse_max_time(interval, "val_check_interval")
    elif isinstance(interval, bool) or not isinstance(interval, (int, float)):
        raise TypeError(
            f"val_check_interval expects a float in (0, 1], an int number of batches, or a duration ('DD:HH:MM:SS', "
            f"a datetime.timedelta or a dict of its arguments), got {interval!r}."
        )
    if isinstance(interval, float) and not 0.0 < interval <= 1.0:
        raise ValueError(
            f"val_check_interval={interval} is a fraction of an epoch outside (0, 1]. Use e.g. 0.25 to validate four "
            f"times per epoch, or an int to validate every that many training batches."
        )
    if isinstance(interval, int) and interval < 1:
        raise ValueError(f"val_check_interval={interval}; an int counts training batches and must be >= 1.")
    if check_val_every_n_epoch is None:
        if isinstance(interval, float):
            raise ValueError(
                f"check_val_every_n_epoch=None validates every val_check_interval batches across epochs, which needs "
                f"an int val_check_interval or a duration (got {interval!r})."
            )
    else:
        _int(
            "check_val_every_n_epoch",
            check_val_every_n_epoch,
            1,
            " Use None to count val_check_interval across epochs.",
        )
    sanity = _int(
        "num_sanity_val_steps",
        2 if num_sanity_val_steps is None else num_sanity_val_steps,
        -1,
        " Use -1 for all.",
    )
    # Left unset, ``drivetrain launch --gradient_accumulation_steps`` decides (else 1).
    launched = accumulation_steps(accumulate_grad_batches, "accumulate_grad_batches")
    accumulate = _int("accumulate_grad_batches", 1 if launched is None else launched, 1)
    warn_dynamo_unused_by_trainer()
    if gradient_clip_val is not None:
        if isinstance(gradient_clip_val, bool) or not isinstance(gradient_clip_val, (int, float)):
            raise TypeError(f"gradient_clip_val expects a number, got {gradient_clip_val!r}.")
        if gradient_clip_val < 0 or math.isnan(gradient_clip_val):
            raise ValueError(
                f"gradient_clip_val={gradient_clip_val} is negative; use a positive number (or None for no clipping)."
            )
        gradient_clip_val = float(gradient_clip_val) if gradient_clip_val > 0 else None
    if gradient_clip_algorithm not in (None, "norm", "value"):
        raise ValueError(f"gradient_clip_algorithm={gradient_clip_algorithm!r}; use 'norm' or 'value'.")
    if gradient_clip_algorithm is not None and gradient_clip_val is None:
        raise ValueError(
            f"gradient_clip_algorithm={gradient_clip_algorithm!r} does nothing without gradient_clip_val; set both, "
            f"e.g. gradient_clip_val=1.0."
        )
    log_every = _int("log_every_n_steps", 50 if log_every_n_steps is None else log_every_n_steps, 1)
    if not isinstance(inference_mode, bool):
        raise TypeError(f"inference_mode expects True or False, got {inference_mode!r}.")
    settings = LoopSettings(
        max_epochs=max_epochs,
        min_epochs=min_epochs,
        max_steps=max_steps,
        min_steps=min_steps,
        max_time=duration,
        val_check_interval=interval,
        check_val_every_n_epoch=check_val_every_n_epoch,
        num_sanity_val_steps=sanity,
        accumulate_grad_batches=accumulate,
        gradient_clip_val=gradient_clip_val,
        gradient_clip_algorithm=gradient_clip_algorithm,
        log_every_n_steps=log_every,
        fast_dev_run=fast,
        inference_mode=inference_mode,
        **limits,
    )
    if fast:
        # A smoke test of every stage: n batches each, one epoch, no sanity check.
        settings.limit_train_batches = settings.limit_val_batches = fast
        settings.limit_test_batches = settings.limit_predict_batches = fast
        settings.max_steps, settings.max_epochs, settings.num_sanity_val_steps = fast, 1, 0
        settings.val_check_interval, settings.check_val_every_n_epoch = 1.0, 1
    return settings
