"""The precision plugin interface and full 32-bit precision, the default."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

import torch
from torch import Tensor, nn
from torch.optim import Optimizer


class Precision:
    """Casting, autocast, loss scaling and the precision-aware optimizer step.

    This base class is ``"32-true"``: every hook is the identity or the plain PyTorch call, so
    a strategy can call them unconditionally at no measurable cost.
    """

    #: The precision's canonical name (``"32-true"``, ``"bf16-mixed"`` …).
    name: str = "32-true"

    def convert_module(self, module: nn.Module) -> nn.Module:
        """Cast the module's parameters and buffers as this precision requires."""
        return module

    def module_init_context(self) -> AbstractContextManager[Any]:
        """A context in which to create a model so it is born in this precision."""
        return nullcontext()

    def forward_context(self) -> AbstractContextManager[Any]:
        """The context for forward passes (autocast for mixed precision)."""
        return nullcontext()

    @property
    def changes_forward(self) -> bool:
        """Whether :meth:`forward_context`/:meth:`convert_input`/:meth:`convert_output` do anything.

        Front doors skip wrapping ``forward`` entirely when this is False.
        """
        return type(self).forward_context is not Precision.forward_context or (
            type(self).convert_input is not Precision.convert_input
            or type(self).convert_output is not Precision.convert_output
        )

    def convert_input(self, data: Any) -> Any:
        """Cast the floating-point tensors of a batch to the compute dtype."""
        return data

    def convert_output(self, data: Any) -> Any:
        """Cast the floating-point tensors of an output back to full precision."""
        return data

    def pre_backward(self, tensor: Tensor, module: nn.Module | None) -> Tensor:
        """Return the tensor to call ``backward`` on (scaled, for fp16 mixed precision)."""
        return tensor

    def backward(self, tensor: Tensor, module: nn.Module | None, *args: Any, **kwargs: Any) -> None:
        """Run the backward pass."""
        tensor.backward(*args, **kwargs)

    def post_backward(self, tensor: Tensor, module: nn.Module | None) -> Tensor:
        """Hook after the backward pass."""
        return tensor

    def optimizer_step(
        self, optimizer: Optimizer, closure: Callable[[], Any] | None = None, **kwargs: Any
    ) -> Any:
        """Step the optimizer; returns what ``optimizer.step`` returns."""
        return optimizer.step(closure, **kwargs) if closure is not None else optimizer.step(**kwargs)

    @property
    def last_step_skipped(self) -> bool:
        """Whether the most recent :meth:`optimizer_step` skipped the update (inf/NaN gradients)."""
        return False

    @property
    def skips_nonfinite_steps(self) -> bool:
        """Whether :meth:`optimizer_step` skips a step whose gradients hold inf/NaN (a loss scaler does).

        The step policy reads it: where it is True, an inf/NaN gradient norm met while clipping
        is left to this skip; elsewhere it is an error, in both front doors.
        """
        return False

    def unscale_gradients(self, optimizer: Optimizer) -> None:
        """Divide the gradients by the loss scale, if there is one (before clipping)."""

    def main_params(self, optimizer: Optimizer) -> Iterator[nn.Parameter]:
        """The parameters the optimizer updates (for gradient clipping)."""
        for group in optimizer.param_groups:
            yield from group["params"]

    def connect(self, model: Any, optimizers: Any, lr_schedulers: Any) -> tuple[Any, Any, Any]:
        """Hook for custom strategies (the seeds call ``precision_plugin.connect(...)``)."""
        return model, optimizers, lr_schedulers

    def state_dict(self) -> dict[str, Any]:
        """State to put in a checkpoint (the loss scaler's, for fp16)."""
        return {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""

    def teardown(self) -> None:
        """Undo global changes made by this plugin."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"


@contextmanager
def default_dtype(dtype: torch.dtype) -> Iterator[None]:
    """Temporarily make ``dtype`` torch's default floating-point dtype."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)
