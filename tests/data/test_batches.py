"""Operations on collated batches (dispatching needs them) and the per-step batch mover."""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import pytest
import torch
from torch import Tensor

import drivetrain as dt
from drivetrain.accelerators import CPUAccelerator
from drivetrain.data import batch_length, concatenate_batches, pad_batch, slice_batch
from drivetrain.strategies import SingleDeviceStrategy


@dataclasses.dataclass
class Sample:
    inputs: Tensor
    names: list[str]


class Pair(NamedTuple):
    x: Tensor
    y: Tensor


def _batch(start: int, size: int) -> dict[str, object]:
    ids = torch.arange(start, start + size)
    return {
        "pair": Pair(ids.float(), ids * 10),
        "sample": Sample(ids.unsqueeze(1).repeat(1, 2), [f"s{i}" for i in ids.tolist()]),
        "scale": torch.tensor(2.0),
    }


def test_nested_batches_are_sliced_joined_and_padded_leaf_by_leaf() -> None:
    first, second = _batch(0, 4), _batch(4, 3)
    assert batch_length(first) == 4
    joined = concatenate_batches([first, second])
    assert isinstance(joined["pair"], Pair) and isinstance(joined["sample"], Sample)
    assert joined["pair"].y.tolist() == [0, 10, 20, 30, 40, 50, 60]
    assert joined["sample"].names == [f"s{i}" for i in range(7)]
    assert joined["scale"].item() == 2.0
    part = slice_batch(joined, 2, 5)
    assert part["pair"].x.tolist() == [2.0, 3.0, 4.0] and part["sample"].names == ["s2", "s3", "s4"]
    assert part["sample"].inputs.shape == (3, 2)
    padded = pad_batch(second, first, 6)  # the source has 4 items: cycled
    assert padded["pair"].y.tolist() == [40, 50, 60, 0, 10, 20, 30, 0, 10]


def test_batch_length_needs_something_to_count() -> None:
    with pytest.raises(TypeError, match="Cannot tell how many items the batch holds"):
        batch_length({"scale": torch.tensor(1.0), "name": "x"})


def test_on_the_cpu_there_is_no_mover_at_all() -> None:
    assert dt.connect(accelerator="cpu").batch_mover() is None  # nothing runs per batch


def test_the_mover_returns_batches_already_on_the_device_untouched() -> None:
    # A device other than the CPU without faking any hardware: the meta device.
    move = SingleDeviceStrategy(torch.device("meta"), accelerator=CPUAccelerator()).batch_mover()
    assert move is not None
    batch = [torch.ones(2, device="meta"), torch.zeros(2, device="meta")]
    assert move(batch) is batch
    single = torch.ones(1, device="meta")
    assert move(single) is single
    assert move(torch.ones(1)).device.type == "meta"
    nested = {"a": (torch.ones(1),), "b": "text"}
    moved = move(nested)
    assert moved is not nested and moved["b"] == "text" and moved["a"][0].device.type == "meta"
    mixed = (torch.ones(1, device="meta"), torch.ones(1))
    assert all(t.device.type == "meta" for t in move(mixed))


def test_a_strategy_that_overrides_batch_to_device_is_always_asked() -> None:
    calls = []

    class Tagging(SingleDeviceStrategy):
        def batch_to_device(self, batch: object, device: torch.device | None = None) -> object:
            calls.append(batch)
            return batch

    move = dt.connect(accelerator="cpu", strategy=Tagging()).batch_mover()
    assert move is not None
    batch = [torch.ones(1)]
    move(batch)
    assert calls == [batch]
