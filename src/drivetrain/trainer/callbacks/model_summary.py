"""``ModelSummary``: the module's layers and parameter counts when fitting starts (an INFO message, rank 0)."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from drivetrain._utilities.apply import move_to_device
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


def _shape(value: Any) -> Any:
    """A tensor's size as a list; sizes of the tensors in a tuple or list; ``"?"`` for anything else."""
    if isinstance(value, torch.Tensor):
        return list(value.shape)
    if isinstance(value, (list, tuple)):
        return [_shape(item) for item in value]
    return "?"


def _sizes(
    module: nn.Module, layers: list[tuple[str, nn.Module]], example: Any, precision: Any
) -> dict[str, tuple[Any, Any]]:
    """Each layer's input and output sizes when ``module`` runs ``example`` (eval mode, no gradients).

    The run goes through ``precision`` (its input conversion and forward context) like a training step.
    """
    sizes: dict[str, tuple[Any, Any]] = {}

    def record(name: str) -> Any:
        def hook(_: nn.Module, args: tuple[Any, ...], output: Any) -> None:
            sizes.setdefault(name, (_shape(args[0] if len(args) == 1 else list(args)), _shape(output)))

        return hook

    handles = [layer.register_forward_hook(record(name)) for name, layer in layers]
    device = next((p.device for p in module.parameters()), torch.device("cpu"))
    example = move_to_device(example, device)
    if precision is not None:
        example = precision.convert_input(example)
    mode = module.training
    try:
        module.eval()
        with (
            torch.no_grad(),
            precision.forward_context() if precision is not None else contextlib.nullcontext(),
        ):
            if isinstance(example, dict):
                output = module(**example)
            elif isinstance(example, tuple):
                output = module(*example)
            else:
                output = module(example)
    finally:
        module.train(mode)
        for handle in handles:
            handle.remove()
    sizes[""] = (_shape(example), _shape(output))
    return sizes


def _plain(module: nn.Module) -> bool:
    """Whether every parameter is whole here: a sharded one (FSDP, ZeRO-3) cannot run on one process alone."""
    return all(type(p.data) is torch.Tensor and not hasattr(p, "ds_id") for p in module.parameters())


@dataclass
class SummaryData:
    """What a model summary shows: one row per layer down to the depth asked, and the totals."""

    header: list[str]
    rows: list[tuple[Any, ...]]
    trainable: int
    frozen: int
    size_mb: float
    #: The whole module's input and output sizes (when an example input ran), else ``None``.
    input_output: tuple[Any, Any] | None = None

    @property
    def totals(self) -> list[tuple[str, str]]:
        """(value, label) lines under the table."""
        return [
            (_human(self.trainable), "trainable params"),
            (_human(self.frozen), "non-trainable params"),
            (_human(self.trainable + self.frozen), "total params"),
            (f"{self.size_mb:.3f}", "total estimated model params size (MB)"),
        ]


def summary_data(
    module: nn.Module, max_depth: int = 1, example_input: Any = None, precision: Any = None
) -> SummaryData:
    """The rows and totals of ``module``'s summary (see :func:`summarize`)."""
    layers = [
        (name, child) for name, child in module.named_modules() if name and name.count(".") + 1 <= max_depth
    ]
    sizes = _sizes(module, layers, example_input, precision) if example_input is not None else None
    rows: list[tuple[Any, ...]] = []
    for name, child in layers:
        trainable, frozen = _count(child)
        row: tuple[Any, ...] = (
            len(rows),
            name,
            type(child).__name__,
            _human(trainable + frozen),
            "train" if child.training else "eval",
        )
        if sizes is not None:
            row += tuple(str(size) for size in sizes.get(name, ("?", "?")))
        rows.append(row)
    trainable, frozen = _count(module)
    size_mb = sum(p.numel() * p.element_size() for p in module.parameters()) / 1e6
    header = ["", "Name", "Type", "Params", "Mode"] + (["In sizes", "Out sizes"] if sizes is not None else [])
    return SummaryData(header, rows, trainable, frozen, size_mb, sizes[""] if sizes is not None else None)


def summarize(module: nn.Module, max_depth: int = 1, example_input: Any = None, precision: Any = None) -> str:
    """A table of ``module``'s submodules down to ``max_depth`` with their parameter counts, and totals.

    With ``example_input`` (the module's ``example_input_array``), the module runs it once and the
    table shows each layer's input and output sizes (``"?"`` for a layer the run did not reach).
    """
    return _text(summary_data(module, max_depth, example_input, precision))


def _text(data: SummaryData) -> str:
    table = format_table(data.header, data.rows) if data.rows else "(no submodules)"
    if data.input_output is not None:
        table += f"\nInput: {data.input_output[0]}  Output: {data.input_output[1]}"
    totals = "\n".join(f"{value:>10}  {label}" for value, label in data.totals)
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
        example = pl_module.example_input_array
        if example is not None and not _plain(pl_module):
            _log.info("The model summary shows no layer sizes: the parameters are sharded across processes.")
            example = None
        self.show(summary_data(pl_module, depth, example, trainer.precision_plugin))

    def show(self, data: SummaryData) -> None:
        """Present the summary (an INFO message of the ``drivetrain`` logger); subclasses render it their way."""
        _log.info(_text(data))
