"""What the scripts import from ``accelerate.test_utils``: assertion helpers, written for drivetrain.

``RegressionDataset`` and ``RegressionModel`` are the installed package's own (its
``test_utils/training.py``, loaded through the hook); the helpers below are the few the scripts
call, each with Accelerate's meaning, built on drivetrain's public API.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from accelerate.test_utils.training import RegressionDataset, RegressionModel  # type: ignore[import-not-found]

from drivetrain.utils import gather

__all__ = ["RegressionDataset", "RegressionModel", "are_the_same_tensors", "assert_exception", "torch_device"]

#: The device the scripts' baselines run on: these runs are on the CPU.
torch_device = "cpu"


def are_the_same_tensors(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` has the same value on every process (a collective call)."""
    local = tensor[None].clone()
    everywhere = gather(local).cpu()
    return all(torch.equal(row, local[0].cpu()) for row in everywhere)


@contextmanager
def assert_exception(exception_class: type[BaseException], msg: str | None = None) -> Iterator[None]:
    """The block must raise ``exception_class`` (whose message contains ``msg``, if given)."""
    try:
        yield
    except exception_class as error:
        if msg is not None and msg not in str(error):
            raise AssertionError(
                f"{exception_class.__name__} raised, but without {msg!r}: {error}"
            ) from error
        return
    raise AssertionError(f"{exception_class.__name__} was not raised")
