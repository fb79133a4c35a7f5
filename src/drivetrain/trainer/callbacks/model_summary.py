"""``ModelSummary``: the module's layers and parameter counts when fitting starts (an INFO message, rank 0)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from torch import nn

from drivetrain._utilities.log import get_logger
from drivetrain.trainer.callbacks.callback import Callback
from drivetrain.trainer.summary_table import format_table

_log = get_logger(__name__)

if TYPE_CHECKING:
    from drivetrain.trainer.module import TrainingModule
    from drivetrain.trainer.trainer import Trainer


def _count(module: nn.Module) -> tuple[int, int]:
    trainable = frozen = 0
    for parameter in module.parameters():
        if parameter.requires_grad:
            trainable += parameter.numel()
        else:
            frozen += parameter.numel()
    return trainable, frozen


def _human(count: float) -> str:
    for unit in ("", " K", " M", " B", " T"):
        if abs(count) < 1000:
            return f"{count:.0f}{unit}" if unit == "" else f"{count:.1f}{unit}"
        count /= 1000
    return f"{count:.1f} P"


def summarize(module: nn.Module, max_depth: int = 1) -> str:
    """A table of ``module``'s submodules down to ``max_depth`` with their parameter counts, and totals."""
    rows: list[tuple[Any, ...]] = []
    for name, child in module.named_modules():
        depth = name.count(".") + 1 if name else 0
        if 0 < depth <= max_depth:
            trainable, frozen = _count(child)
            rows.append(
                (
                    len(rows),
                    name,
                    type(child).__name__,
                    _human(trainable + frozen),
                    "train" if child.training else "eval",
                )
            )
    trainable, frozen = _count(module)
    size_mb = sum(p.numel() * p.element_size() for p in module.parameters()) / 1e6
    table = format_table(["", "Name", "Type", "Params", "Mode"], rows) if rows else "(no submodules)"
    totals = (
        f"{_human(trainable):>10}  trainable params\n{_human(frozen):>10}  non-trainable params\n"
        f"{_human(trainable + frozen):>10}  total params\n{size_mb:>10.3f}  total estimated model params size (MB)"
    )
    return f"{table}\n{totals}"


class ModelSummary(Callback):
    """Log a summary of the module at the start of fit (silence it with the ``drivetrain`` logger's level).

    Args:
        max_depth: how deep into nested submodules the table goes (0: totals only).
    """

    def __init__(self, max_depth: int = 1) -> None:
        if isinstance(max_depth, bool) or not isinstance(max_depth, int) or max_depth < -1:
            raise ValueError(f"ModelSummary(max_depth={max_depth!r}); use an int >= 0 (-1: every level).")
        self.max_depth = max_depth

    def on_fit_start(self, trainer: Trainer, pl_module: TrainingModule) -> None:
        if not trainer.is_global_zero:
            return
        depth = 10**6 if self.max_depth == -1 else self.max_depth
        _log.info(summarize(pl_module, depth))
