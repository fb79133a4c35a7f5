"""A strategy written as a user would, in its own module: nothing else in drivetrain knows it.

:class:`GradientAveraging` is data parallelism without ``DistributedDataParallel``: each process
keeps a full copy (made equal at set-up), and every backward averages the gradients over the
processes. :class:`EngineStepped` declares that its engine owns accumulation, as DeepSpeed does.
Both register their short names by defining ``register_strategies``; the front doors learn what
they can do from their declared capabilities only.
"""

from __future__ import annotations

from typing import Any

import torch.distributed as dist
from torch import Tensor, nn

from drivetrain.strategies import ParallelStrategy, SingleDeviceStrategy


class GradientAveraging(ParallelStrategy):
    """Every process trains a full copy; gradients are averaged after each backward."""

    kind = "parallel"

    @classmethod
    def register_strategies(cls, strategy_registry: Any) -> None:
        strategy_registry.register("grad_average", cls, description="data parallel by averaging gradients")

    def setup_module(self, module: nn.Module) -> nn.Module:
        module = module.to(self.root_device)
        for tensor in [*module.parameters(), *module.buffers()]:
            dist.broadcast(tensor.data, src=0)
        return module

    def backward(self, tensor: Tensor, module: nn.Module | None = None, *args: Any, **kwargs: Any) -> None:
        super().backward(tensor, module, *args, **kwargs)
        parameters = module.parameters() if module is not None else ()
        for parameter in parameters:
            if parameter.grad is not None:
                dist.all_reduce(parameter.grad)
                parameter.grad /= self.world_size


class EngineStepped(SingleDeviceStrategy):
    """One device, but an engine (as DeepSpeed's) decides accumulation and the optimizer step."""

    kind = "single_device"
    owns_accumulation = True

    @classmethod
    def register_strategies(cls, strategy_registry: Any) -> None:
        strategy_registry.register("engine_stepped", cls, description="accumulation owned by an engine")
