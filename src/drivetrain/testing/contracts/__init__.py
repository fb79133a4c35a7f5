"""The contract checks: what drivetrain's core calls on each kind of plugin, tried in this process.

Each check is a function that returns ``None`` when the contract holds, a sentence saying what
is wrong, or :class:`NotApplicable` with the reason; :func:`rows` runs them in order, turning an
exception into a failure that names it, and stops after a check marked ``essential`` fails (the
rest would only repeat it).
"""

from __future__ import annotations

import io
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from drivetrain.testing.report import CheckResult, failed, not_applicable, passed


@dataclass(frozen=True)
class NotApplicable:
    """A check that does not apply to this plugin, and why."""

    why: str


@dataclass(frozen=True)
class Check:
    """One contract check: its row name, the function, and what to implement when it fails."""

    name: str
    run: Callable[[], str | NotApplicable | None]
    fix: str
    essential: bool = False


def rows(checks: Sequence[Check]) -> list[CheckResult]:
    """Run ``checks`` in order; after a failed essential one, the rest are not applicable."""
    found: list[CheckResult] = []
    blocked: str | None = None
    for check in checks:
        if blocked is not None:
            found.append(not_applicable(check.name, f"skipped: {blocked} failed first"))
            continue
        with warnings.catch_warnings(record=True) as warned:
            # A plugin's warnings are part of what it does, not failures (the caller may treat warnings as errors).
            warnings.simplefilter("always")
            try:
                outcome = check.run()
            except Exception as error:
                outcome = f"raised {type(error).__name__}: {error}"
        if outcome is None:
            said = sorted({str(w.message) for w in warned})
            found.append(passed(check.name, f"warned: {' | '.join(said)}" if said else ""))
        elif isinstance(outcome, NotApplicable):
            found.append(not_applicable(check.name, outcome.why))
        else:
            found.append(failed(check.name, _sentence(outcome), check.fix))
            if check.essential:
                blocked = f"'{check.name}'"
    return found


def _sentence(text: str) -> str:
    text = text.strip()
    return text if text.endswith((".", "?", "!")) else text + "."


def weights_only_round_trip(value: Any) -> Any:
    """``value`` saved with ``torch.save`` and read back with ``weights_only=True`` (as checkpoints are)."""
    buffer = io.BytesIO()
    torch.save(value, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


def same(a: Any, b: Any) -> bool:
    """Deep equality for checkpoint contents: tensors by value (and dtype), containers element by element."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (
            isinstance(a, torch.Tensor)
            and isinstance(b, torch.Tensor)
            and a.dtype == b.dtype
            and a.shape == b.shape
            and torch.equal(a.cpu(), b.cpu())
        )
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b) and type(a) is type(b)
