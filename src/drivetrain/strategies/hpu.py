"""Strategies for Intel Gaudi cards (HPUs): one card (``"hpu_single"``) and DDP over HCCL (``"hpu_parallel"``).

Gaudi's PyTorch bridge runs lazily by default: operations are collected into a graph that runs
when ``habana_frameworks.torch.core.mark_step()`` is called. Both strategies mark a step after the
backward pass and after the optimizer step, as Intel Gaudi's documentation asks for training
loops, so a graph is one half-step long and compiled once. Across processes they use HCCL, Gaudi's
collective library, which ``habana_frameworks.torch.distributed.hccl`` registers with
``torch.distributed`` when imported. ``habana_frameworks`` is imported only inside methods.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from torch import Tensor, nn
from torch.optim import Optimizer

from drivetrain.accelerators.hpu import HPUAccelerator
from drivetrain.strategies.ddp import DDPStrategy
from drivetrain.strategies.single_device import SingleDeviceStrategy

if TYPE_CHECKING:
    from drivetrain.accelerators.accelerator import Accelerator


def _check_hpu(name: str, accelerator: Accelerator) -> None:

    if not isinstance(accelerator, HPUAccelerator):
        raise ValueError(
            f"strategy={name!r} runs on Intel Gaudi cards only, but the accelerator is {type(accelerator).__name__}. "
            f"Use accelerator='hpu', or strategy='auto' for this hardware."
        )


def _mark_step() -> None:
    import habana_frameworks.torch.core as htcore

    htcore.mark_step()


class SingleHPUStrategy(SingleDeviceStrategy):
    """Train in this process on one Gaudi card (what ``"auto"`` picks for ``accelerator="hpu", devices=1``)."""

    def check_accelerator(self, accelerator: Accelerator) -> None:
        _check_hpu("hpu_single", accelerator)

    def backward(self, tensor: Tensor, module: nn.Module | None = None, *args: Any, **kwargs: Any) -> None:
        """The precision's backward, then run the graph collected so far (``mark_step``)."""
        super().backward(tensor, module, *args, **kwargs)
        _mark_step()

    def optimizer_step(
        self,
        optimizer: Optimizer,
        closure: Callable[[], Any] | None = None,
        model: nn.Module | None = None,
        **kwargs: Any,
    ) -> Any:
        """Step through the precision, then run the step's graph (``mark_step``)."""
        result = super().optimizer_step(optimizer, closure, model, **kwargs)
        _mark_step()
        return result

    @classmethod
    def register_strategies(cls, strategy_registry: Any) -> None:
        strategy_registry.register(
            "hpu_single", cls, description="One process on one Intel Gaudi card (HPU)."
        )


class HPUParallelStrategy(DDPStrategy):
    """DDP over Gaudi cards, one process each, with HCCL collectives (``process_group_backend="hccl"``).

    Takes every :class:`~drivetrain.strategies.DDPStrategy` argument; ``process_group_backend``
    defaults to ``"hccl"``.
    """

    def check_accelerator(self, accelerator: Accelerator) -> None:
        _check_hpu("hpu_parallel", accelerator)

    @property
    def process_group_backend(self) -> str:
        return self.process_group_options.process_group_backend or "hccl"

    def setup_environment(self) -> None:
        if self.process_group_backend == "hccl":
            import habana_frameworks.torch.distributed.hccl  # noqa: F401 - registers the "hccl" backend
        super().setup_environment()

    def backward(self, tensor: Tensor, module: nn.Module | None = None, *args: Any, **kwargs: Any) -> None:
        """The precision's backward (DDP reduces the gradients in it), then ``mark_step``."""
        super().backward(tensor, module, *args, **kwargs)
        _mark_step()

    def optimizer_step(
        self,
        optimizer: Optimizer,
        closure: Callable[[], Any] | None = None,
        model: nn.Module | None = None,
        **kwargs: Any,
    ) -> Any:
        """Step through the precision, then run the step's graph (``mark_step``)."""
        result = super().optimizer_step(optimizer, closure, model, **kwargs)
        _mark_step()
        return result

    @classmethod
    def register_strategies(cls, strategy_registry: Any) -> None:
        strategy_registry.register(
            "hpu_parallel",
            cls,
            description="DDP over Intel Gaudi cards (HPUs), one process each, with HCCL collectives.",
        )
