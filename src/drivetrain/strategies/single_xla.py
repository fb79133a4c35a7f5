"""One process on one XLA device (a TPU core): what ``"auto"`` picks for ``accelerator="xla", devices=1``.

XLA tensors are lazy: operations are recorded into a graph that runs when a result is needed or
when the step is marked. Marking the step after every optimizer step keeps the graph one step
long, so it compiles once and runs each step. With a single device there are no gradients to
reduce, no process group and no launcher. ``torch_xla`` is imported only inside the methods that
need it (it is optional, and cannot be installed next to every torch).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.optim import Optimizer

from drivetrain.strategies.single_device import SingleDeviceStrategy

if TYPE_CHECKING:
    from drivetrain.accelerators.accelerator import Accelerator
    from drivetrain.plugins.io.checkpoint_io import CheckpointIO
    from drivetrain.plugins.precision.precision import Precision


class SingleDeviceXLAStrategy(SingleDeviceStrategy):
    """Train in this process on one XLA device.

    Args:
        device: the XLA device (``torch.device("xla", i)``); by default the one ``devices=``
            selects (``devices=1`` is the first, ``devices=[i]`` device ``i``).
        debug: turn on ``torch_xla``'s debug output (``PT_XLA_DEBUG_LEVEL``) for this run.
    """

    kind = "xla"  # Accelerate says XLA for one TPU core too

    def __init__(
        self,
        device: torch.device | str | int | None = None,
        accelerator: Accelerator | None = None,
        checkpoint_io: CheckpointIO | None = None,
        precision: Precision | None = None,
        *,
        precision_plugin: Precision | None = None,
        debug: bool = False,
    ) -> None:
        if isinstance(device, int) and not isinstance(device, bool):
            device = torch.device("xla", device)  # an index means an XLA device here, not a CUDA one
        super().__init__(device, accelerator, checkpoint_io, precision, precision_plugin=precision_plugin)
        self._debug = debug

    @property
    def debug(self) -> bool:
        """Whether ``torch_xla``'s debug output is turned on for the run."""
        return self._debug

    def check_accelerator(self, accelerator: Accelerator) -> None:
        from drivetrain.accelerators.xla import XLAAccelerator

        if not isinstance(accelerator, XLAAccelerator):
            raise ValueError(
                f"strategy='single_xla' runs on one XLA device, but the accelerator is {type(accelerator).__name__}. "
                f"Use accelerator='xla' (or 'tpu'), or strategy='auto' for this hardware."
            )

    def setup_environment(self) -> None:
        if self._debug:
            os.environ.setdefault("PT_XLA_DEBUG_LEVEL", "1")
        super().setup_environment()

    def optimizer_step(
        self,
        optimizer: Optimizer,
        closure: Callable[[], Any] | None = None,
        model: nn.Module | None = None,
        **kwargs: Any,
    ) -> Any:
        """Step through the precision, then run the step's graph (``xm.mark_step``)."""
        import torch_xla.core.xla_model as xm

        result = self.precision.optimizer_step(optimizer, closure, **kwargs)
        xm.mark_step()
        return result

    @classmethod
    def register_strategies(cls, strategy_registry: Any) -> None:
        strategy_registry.register(
            "single_xla",
            cls,
            description="One process on one XLA device (what 'auto' picks for one TPU core).",
        )
