"""Building a model for a strategy without initialising weights that will be overwritten.

:meth:`Strategy.module_init_context(empty_init=True)
<drivetrain.strategies.Strategy.module_init_context>` enters :func:`skip_parameter_init`: the
weights are loaded from a checkpoint or materialised by a sharded strategy afterwards, so their
random initialisation would be wasted time.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor


@contextmanager
def skip_parameter_init() -> Iterator[None]:
    """Make ``nn.init`` functions and ``reset_parameters`` no-ops while a model is built."""
    names = [n for n in dir(torch.nn.init) if n.endswith("_") and not n.startswith("_")]
    saved = {n: getattr(torch.nn.init, n) for n in names}
    try:
        for name in names:
            setattr(torch.nn.init, name, _return_tensor)
        yield
    finally:
        for name, function in saved.items():
            setattr(torch.nn.init, name, function)


def _return_tensor(tensor: Tensor, *args: Any, **kwargs: Any) -> Tensor:
    return tensor
