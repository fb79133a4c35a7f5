"""The order in which a model (and its optimizers) is put on a strategy: one place, both front doors.

``Trainer.fit`` and ``Accelerator.prepare`` both call :func:`setup_model`; they add only what is
theirs (the Trainer builds ``configure_model()`` layers first and takes its optimizers from
``configure_optimizers()``; the Accelerator wraps ``forward`` for the precision). The order:

1. private copies of tensors that arrived in shared memory (``torch.multiprocessing`` spawn);
2. ``precision.convert_module`` (in place: a 16-bit or 64-bit model);
3. ``strategy.module_to_device`` (sharded strategies move nothing: they place shards themselves);
4. the optimizers, built now if a function is given, on the placed, *unwrapped* module;
5. one ``strategy.setup_module_and_optimizers`` call: DDP wraps; FSDP and DeepSpeed shard and
   re-point the optimizers at the parameters they created.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from torch import nn
from torch.optim import Optimizer

if TYPE_CHECKING:
    from drivetrain.strategies.strategy import Strategy


def setup_model(
    strategy: Strategy,
    module: nn.Module,
    optimizers: Sequence[Optimizer] | Callable[[], Sequence[Optimizer]] = (),
    *,
    move_to_device: bool = True,
    wrap: bool = True,
) -> tuple[nn.Module, list[Optimizer]]:
    """Put ``module`` and its ``optimizers`` on ``strategy``, in the order of the module docstring.

    Args:
        strategy: a strategy whose environment is set up (processes, device).
        module: the user's module; converted and moved in place.
        optimizers: optimizers of ``module``'s parameters, or a function that builds them once
            the module is converted and placed (so they are created on the final parameters).
        move_to_device: ``False`` leaves the module where it is (the user places it).
        wrap: ``False`` stops after placing (a module for evaluation only): no wrapper and no
            optimizers.

    Returns:
        What to call (the wrapped module, or ``module`` itself) and the optimizers to step (the
        strategy may return new ones).

    Raises:
        TypeError: the precision's ``convert_module`` returned a new module instead of converting
            this one (the caller's references would go stale).
    """
    unshare(module)
    precision = strategy.precision
    if precision.convert_module(module) is not module:
        raise TypeError(
            f"{type(precision).__name__}.convert_module returned a new module; it must convert the given "
            f"module in place and return it (e.g. `return module.to(dtype)`), so the front doors and the "
            f"user keep one module."
        )
    if move_to_device:
        strategy.module_to_device(module)
    if not wrap:
        return module, []
    built = list(optimizers() if callable(optimizers) else optimizers)
    wrapped, set_up = strategy.setup_module_and_optimizers(module, built)
    return wrapped, list(set_up)


def unshare(module: nn.Module) -> None:
    """Give this process its own copy of tensors that arrived in shared memory.

    torch.multiprocessing's spawn hands CPU tensors to the new processes through shared memory,
    so without this every rank (and the parent) would update one and the same set of weights.
    """
    for tensor in (*module.parameters(), *module.buffers()):
        if tensor.device.type == "cpu" and tensor.is_shared():
            tensor.data = tensor.data.clone()
