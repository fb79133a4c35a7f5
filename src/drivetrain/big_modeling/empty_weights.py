"""Build a model without allocating its weights: ``init_empty_weights`` / ``init_on_device``.

Inside the context, every parameter a module registers is created on the given device; with
``device="meta"`` a model of any size costs no memory, and its shapes and dtypes are all there
(for :func:`~drivetrain.big_modeling.infer_auto_device_map`, ``drivetrain estimate-memory``, or
loading a checkpoint straight to its devices). The patch is process-wide while the context is
open: build one model at a time.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn


@contextmanager
def init_on_device(device: torch.device | str, include_buffers: bool = False) -> Iterator[None]:
    """Create the parameters (and buffers, if ``include_buffers``) of modules built in the block on ``device``.

    With ``include_buffers=True`` every tensor made in the block is created there directly. Without
    it, buffers keep their values on the CPU, and each parameter is made where its module makes it
    and moved at once: the peak is one parameter, not the model (Accelerate's behaviour too).

    Example::

        with init_on_device("meta"):
            model = nn.Linear(100_000, 100_000)   # 40 GB of weights, no memory used
    """
    device = torch.device(device)
    if include_buffers:
        # Every tensor a factory function makes inside the block lands on the device.
        with device:
            yield
        return
    register_parameter = nn.Module.register_parameter

    def on_device(module: nn.Module, name: str, param: nn.Parameter | None) -> None:
        register_parameter(module, name, param)
        if param is not None and param.device != device:
            moved = module._parameters[name]
            assert moved is not None
            extra: dict[str, Any] = dict(moved.__dict__)
            new = type(moved)(moved.to(device), requires_grad=moved.requires_grad)
            new.__dict__.update(extra)
            module._parameters[name] = new

    nn.Module.register_parameter = on_device  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        nn.Module.register_parameter = register_parameter  # type: ignore[method-assign]


@contextmanager
def init_empty_weights(include_buffers: bool = False) -> Iterator[None]:
    """Build modules with their parameters on the ``meta`` device (no memory); buffers too if ``include_buffers``.

    Load real weights afterwards with :func:`~drivetrain.big_modeling.load_checkpoint_and_dispatch`
    (or ``model.to_empty(device=...)`` and a ``load_state_dict``).
    """
    with init_on_device(torch.device("meta"), include_buffers=include_buffers):
        yield
