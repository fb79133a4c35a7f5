"""``find_executable_batch_size`` as Accelerate 1.x defines it: 90 % after each out-of-memory error,
a ``reduce_batch_size_fn`` called with no arguments, and the size that fitted kept between calls."""

from __future__ import annotations

import pytest
import torch

from drivetrain.utils import find_executable_batch_size


def _fits_up_to(limit: int, tried: list[int]):  # type: ignore[no-untyped-def]
    def train(batch_size: int) -> int:
        tried.append(batch_size)
        if batch_size > limit:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return batch_size

    return train


def test_the_default_takes_ninety_percent_and_keeps_the_size_that_fitted() -> None:
    tried: list[int] = []
    train = find_executable_batch_size(_fits_up_to(80, tried), starting_batch_size=100)
    assert train() == 72
    assert tried == [100, 90, 81, 72]
    tried.clear()
    assert train() == 72 and tried == [72]  # a later call starts where the last one fitted


def test_reduce_batch_size_fn_is_called_without_arguments_as_in_accelerate() -> None:
    tried: list[int] = []
    sizes = iter([50, 20])
    train = find_executable_batch_size(
        _fits_up_to(30, tried), starting_batch_size=100, reduce_batch_size_fn=lambda: next(sizes)
    )
    assert train() == 20 and tried == [100, 50, 20]


def test_a_reduction_that_takes_the_size_is_given_the_size_that_did_not_fit() -> None:
    tried: list[int] = []
    train = find_executable_batch_size(
        _fits_up_to(30, tried), starting_batch_size=128, reduce_batch_size_fn=lambda size: size // 2
    )
    assert train() == 16 and tried == [128, 64, 32, 16]


def test_reaching_zero_and_bad_reductions_are_explained() -> None:
    never = find_executable_batch_size(_fits_up_to(0, []), starting_batch_size=3)
    with pytest.raises(RuntimeError, match="No executable batch size found, reached zero"):
        never()  # 3, 2, 1, then int(0.9) == 0
    wrong = find_executable_batch_size(
        _fits_up_to(0, []), starting_batch_size=3, reduce_batch_size_fn=lambda: 1.5
    )
    with pytest.raises(TypeError, match="must return the next batch size as an int"):
        wrong()
    with pytest.raises(TypeError, match="reduce_batch_size_fn must be a function"):
        find_executable_batch_size(starting_batch_size=3, reduce_batch_size_fn=2)  # type: ignore[arg-type]
