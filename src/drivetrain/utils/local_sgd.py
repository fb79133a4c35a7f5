"""``LocalSGD``: each process takes its own optimizer steps, and the weights are averaged every K steps.

Accelerate's helper, on drivetrain's Accelerator::

    with LocalSGD(accelerator, model, local_sgd_steps=8) as local_sgd:
        for batch in loader:
            ...                      # forward, backward, optimizer.step(): no gradient all-reduce
            local_sgd.step()         # every 8th call averages the parameters over the processes

The gradients are not all-reduced inside the block (``accelerator.no_sync(model)``); leaving the
block averages once more, so every process ends with the same weights. Data-parallel strategies
only (one process, DDP on CPUs or GPUs): sharded ones (FSDP, DeepSpeed) hold different parts of
the weights on each process, which averaging would mix up.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any

import torch
from torch import nn

from drivetrain.utils.configuration import DistributedType


class LocalSGD:
    """Local SGD on top of an Accelerator: average ``model``'s parameters every ``local_sgd_steps`` steps.

    Args:
        accelerator: the ``drivetrain.Accelerator`` that prepared ``model``.
        model: the prepared model whose parameters are averaged.
        local_sgd_steps: optimizer steps each process takes on its own between two averagings.
        enabled: ``False`` makes the block and :meth:`step` do nothing (as does a run of one process).

    Raises:
        NotImplementedError: the strategy shards the weights (FSDP, DeepSpeed, XLA).
        ValueError: ``local_sgd_steps`` is not a positive integer.
    """

    def __init__(
        self, accelerator: Any, model: nn.Module, local_sgd_steps: int, enabled: bool = True
    ) -> None:

        kind = accelerator.distributed_type
        data_parallel = (
            DistributedType.NO,
            DistributedType.MULTI_CPU,
            DistributedType.MULTI_GPU,
            DistributedType.MULTI_XPU,
            DistributedType.MULTI_MPS,
        )
        if kind not in data_parallel:
            raise NotImplementedError(
                f"LocalSGD averages whole copies of the weights, so it runs with data-parallel strategies only "
                f"(one process, or DDP on CPUs or GPUs); this Accelerator's is {kind.value}. Use "
                f"strategy='ddp', or train without LocalSGD."
            )
        if isinstance(local_sgd_steps, bool) or not isinstance(local_sgd_steps, int) or local_sgd_steps < 1:
            raise ValueError(f"local_sgd_steps must be an int >= 1, got {local_sgd_steps!r}.")
        self.enabled = bool(enabled) and kind != DistributedType.NO
        self.num_steps = 0
        self.accelerator = accelerator
        self.model = model
        self.local_sgd_steps = local_sgd_steps
        self._no_sync: AbstractContextManager[Any] | None = None

    def __enter__(self) -> LocalSGD:
        if self.enabled:
            self._no_sync = self.accelerator.no_sync(self.model)
            self._no_sync.__enter__()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        if self.enabled and self._no_sync is not None:
            try:
                if exc_info[0] is None:
                    self._average()  # every process leaves with the same weights
            finally:
                self._no_sync.__exit__(*exc_info)
                self._no_sync = None

    def step(self) -> None:
        """Count an optimizer step; every ``local_sgd_steps``-th averages the parameters over the processes."""
        self.num_steps += 1
        if self.enabled and self.num_steps % self.local_sgd_steps == 0:
            self._average()

    def _average(self) -> None:
        self.accelerator.wait_for_everyone()
        with torch.no_grad():
            for parameter in self.model.parameters():
                parameter.copy_(self.accelerator.reduce(parameter.detach(), reduction="mean"))
