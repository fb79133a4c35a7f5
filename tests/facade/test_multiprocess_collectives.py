"""The Accelerator's collectives and process control in 2 gloo processes (one spawn for all)."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

import drivetrain as dt
from drivetrain.utils import DataLoaderConfiguration, gather_object, reduce, set_seed
from helpers.multiprocess import run_processes

pytestmark = pytest.mark.multiprocess

COMBINATIONS = [(split, dispatch) for split in (False, True) for dispatch in (False, True)]


@dataclasses.dataclass
class Output:
    logits: torch.Tensor
    ids: torch.Tensor


class Stream(IterableDataset):  # type: ignore[type-arg]
    def __iter__(self) -> Iterator[torch.Tensor]:
        return iter(torch.arange(99))


def _metrics(split: bool, dispatch: bool) -> dict[str, Any]:
    config = DataLoaderConfiguration(split_batches=split, dispatch_batches=dispatch)
    accelerator = dt.Accelerator(cpu=True, dataloader_config=config)
    out: dict[str, Any] = {}
    for drop_last in (False, True):
        loader = accelerator.prepare(
            DataLoader(TensorDataset(torch.arange(99)), batch_size=16, drop_last=drop_last)
        )
        items, names, padded = [], [], 0
        for (ids,) in loader:
            items += accelerator.gather_for_metrics(ids).tolist()
            names += accelerator.gather_for_metrics([f"item{i}" for i in ids.tolist()])
            padded += len(accelerator.gather(ids))
        out[("map", drop_last)] = (items, names, padded)
        stream = accelerator.prepare(DataLoader(Stream(), batch_size=16, drop_last=drop_last))
        out[("stream", drop_last)] = [
            i for batch in stream for i in accelerator.gather_for_metrics({"ids": batch})["ids"].tolist()
        ]
    return out


def _uneven(items: int, batch_size: int) -> Any:
    """gather_for_metrics over a loader with even_batches=False: every item, or the error."""
    accelerator = dt.Accelerator(cpu=True, even_batches=False)
    loader = accelerator.prepare(DataLoader(TensorDataset(torch.arange(items)), batch_size=batch_size))
    gathered: list[int] = []
    try:
        for (ids,) in loader:
            gathered += accelerator.gather_for_metrics({"ids": ids})["ids"].tolist()
    except ValueError as error:
        return str(error)
    return gathered


def _rank(rank: int, world_size: int, scratch: str) -> dict[str, Any]:
    out: dict[str, Any] = {"metrics": {combo: _metrics(*combo) for combo in COMBINATIONS}}
    out["uneven"] = {shape: _uneven(*shape) for shape in ((9, 5), (10, 3), (9, 4))}
    accelerator = dt.Accelerator(cpu=True)

    out["pad"] = accelerator.pad_across_processes(torch.full((rank + 1, 2), rank), pad_index=-1).tolist()
    out["pad_first"] = accelerator.pad_across_processes(
        {"x": torch.ones(1, rank + 1)}, dim=1, pad_first=True
    )["x"].tolist()
    with accelerator.split_between_processes([0, 1, 2, 3, 4]) as share:
        out["split_list"] = share
    with accelerator.split_between_processes([0, 1, 2, 3, 4], apply_padding=True) as share:
        out["split_padded"] = share
    with accelerator.split_between_processes(torch.arange(10, 15), apply_padding=True) as share:
        out["split_tensor"] = share.tolist()
    with accelerator.split_between_processes({"a": torch.arange(3), "b": ["x", "y", "z"]}) as share:
        out["split_dict"] = (share["a"].tolist(), share["b"])
    value = torch.tensor(float(rank + 1))
    out["reduce"] = (
        accelerator.reduce(value).item(),
        accelerator.reduce({"v": value}, reduction="mean")["v"].item(),
        accelerator.reduce(value, scale=10.0).item(),
        value.item(),
    )
    pair = torch.tensor([1.0 + rank, 4.0 - rank])
    out["reduce_ops"] = {
        op: accelerator.reduce(pair, reduction=op).tolist() for op in ("max", "min", "product")
    }
    out["reduce_ops"]["free max"] = reduce({"v": pair}, "max")["v"].tolist()
    out["gather_nested"] = accelerator.gather((torch.tensor(rank), {"v": torch.tensor([rank, rank])}))
    output = Output(torch.full((1, 2), float(rank)), torch.tensor([rank]))
    gathered = accelerator.gather(output)
    reduced = accelerator.reduce(output, reduction="mean")
    padded = accelerator.pad_across_processes(Output(torch.ones(rank + 1), torch.tensor([rank])))
    out["dataclass"] = (
        gathered.logits.tolist(),
        gathered.ids.tolist(),
        reduced.logits.tolist(),
        padded.logits.tolist(),
    )
    out["gather_object"] = gather_object([f"r{rank}"])
    try:
        accelerator.gather(torch.zeros(rank + 1))
    except ValueError as error:
        out["shape_error"] = str(error)
    out["reduce_mismatch"] = {}
    for case, mine in {
        "length": torch.ones(3 + rank),
        "dims": torch.ones(2, 3) if rank == 0 else torch.ones(6),
        "dtype": torch.ones(2, dtype=torch.float32 if rank == 0 else torch.float64),
        "small and large": torch.ones(3 if rank == 0 else 5000),
        "large": torch.ones(4000 + rank),
    }.items():
        try:
            accelerator.reduce(mine)
            out["reduce_mismatch"][case] = "no error"
        except ValueError as error:
            out["reduce_mismatch"][case] = str(error)
    # On accelerator devices a small reduction's check is read when the next reduce starts (no wait
    # for the device); forced here on the CPU.
    from drivetrain.utils import checked_reduce

    checked_reduce._deferred = lambda device: True  # type: ignore[assignment]
    out["deferred"] = [accelerator.reduce(torch.ones(2 + rank)).tolist()]
    try:
        accelerator.reduce(torch.ones(1))
        out["deferred"].append("no error")
    except ValueError as error:
        out["deferred"].append(str(error))
    # The processes still talk after the errors; every kind of tensor reduces as before.
    out["reduce_kinds"] = {
        "large mean": accelerator.reduce(torch.full((5000,), float(rank + 1)), "mean")[:2].tolist(),
        "int sum": accelerator.reduce(torch.tensor([rank + 1, 10]), "sum").tolist(),
        "int mean": accelerator.reduce(torch.tensor([rank + 1]), "mean").tolist(),
        "bool max": accelerator.reduce(torch.tensor([rank == 0, False]), "max").tolist(),
        "half sum": str(accelerator.reduce(torch.tensor([0.5, 1.5], dtype=torch.float16), "sum")),
        "complex sum": accelerator.reduce(torch.tensor([1 + 2j * rank]), "sum").tolist(),
        "matrix product": accelerator.reduce(torch.full((2, 2), 2.0 + rank), "product").tolist(),
    }

    marker = Path(scratch) / "written-by-main"
    with accelerator.main_process_first():
        if accelerator.is_main_process:
            time.sleep(0.3)
            marker.write_text("ready")
        out["saw_marker"] = marker.exists()
    accelerator.wait_for_everyone()

    if rank == 1:
        accelerator.set_trigger()
    out["triggers"] = (accelerator.check_trigger(), accelerator.check_trigger())

    calls: list[str] = []
    accelerator.on_main_process(lambda: calls.append("main"))()
    accelerator.on_last_process(lambda: calls.append("last"))()
    accelerator.on_process(process_index=1)(lambda: calls.append("one"))()
    accelerator.on_local_main_process(lambda: calls.append("local"))()
    out["calls"] = calls
    out["seed"] = set_seed(5, device_specific=True)
    return out


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    return run_processes(_rank, 2, args=(str(tmp_path_factory.mktemp("collectives")),))


@pytest.mark.parametrize("split, dispatch", COMBINATIONS)
@pytest.mark.parametrize("drop_last", [False, True])
def test_gather_for_metrics_returns_exactly_the_loaders_items(
    results: list[dict[str, Any]], split: bool, dispatch: bool, drop_last: bool
) -> None:
    expected = list(range(96 if drop_last else 99))  # what one process's loader yields
    for result in results:
        items, names, padded = result["metrics"][(split, dispatch)][("map", drop_last)]
        assert items == expected
        assert names == [f"item{i}" for i in expected]
        assert padded >= len(expected) and (padded > 99 or drop_last), "gather keeps the repeats"
        assert result["metrics"][(split, dispatch)][("stream", drop_last)] == expected


def test_gather_for_metrics_with_uneven_batches_returns_every_item_or_says_why_it_cannot(
    results: list[dict[str, Any]],
) -> None:
    for result in results:
        assert result["uneven"][(9, 5)] == list(range(9))  # last batches of 5 and 4 items
        assert result["uneven"][(10, 3)] == list(range(10))  # two batches each, the last of 3 and 1
        # 3 batches of 4, 4 and 1 item dealt to 2 processes: 2 and 1 gathers; the second would never end.
        assert result["uneven"][(9, 4)].startswith(
            "gather_for_metrics in a loop over a loader prepared with even_batches=False, which gives the "
            "processes different numbers of batches (rank 0: 2, rank 1: 1)"
        )


def test_pad_split_reduce_and_gather(results: list[dict[str, Any]]) -> None:
    zero, one = results
    assert zero["pad"] == [[0, 0], [-1, -1]] and one["pad"] == [[1, 1], [1, 1]]
    assert zero["pad_first"] == [[0.0, 1.0]] and one["pad_first"] == [[1.0, 1.0]]
    assert (zero["split_list"], one["split_list"]) == ([0, 1, 2], [3, 4])
    assert (zero["split_padded"], one["split_padded"]) == ([0, 1, 2], [3, 4, 4])
    assert (zero["split_tensor"], one["split_tensor"]) == ([10, 11, 12], [13, 14, 14])
    assert (zero["split_dict"], one["split_dict"]) == (([0, 1], ["x", "y"]), ([2], ["z"]))
    assert zero["reduce"] == (*one["reduce"][:3], 1.0) == (3.0, 1.5, 30.0, 1.0)
    expected_ops = {"max": [2.0, 4.0], "min": [1.0, 3.0], "product": [2.0, 12.0], "free max": [2.0, 4.0]}
    assert zero["reduce_ops"] == one["reduce_ops"] == expected_ops
    scalars, nested = zero["gather_nested"]
    assert scalars.tolist() == [0, 1] and nested["v"].tolist() == [0, 0, 1, 1]
    assert zero["gather_object"] == one["gather_object"] == ["r0", "r1"]
    assert zero["dataclass"] == ([[0.0, 0.0], [1.0, 1.0]], [0, 1], [[0.5, 0.5]], [1.0, 0.0])


def test_gathering_tensors_of_different_shapes_names_the_ranks(results: list[dict[str, Any]]) -> None:
    message = results[0]["shape_error"]
    assert "rank 0: shape (1,)" in message and "rank 1: shape (2,)" in message
    assert "pad_across_processes" in message


def test_reducing_tensors_of_different_shapes_is_an_error_naming_them_on_every_rank(
    results: list[dict[str, Any]],
) -> None:
    expected = {
        "length": ("rank 0: shape (3,), float32", "rank 1: shape (4,), float32"),
        "dims": ("rank 0: shape (2, 3), float32", "rank 1: shape (6,), float32"),
        "dtype": ("rank 0: shape (2,), float32", "rank 1: shape (2,), float64"),
        "small and large": ("rank 0: shape (3,), float32", "rank 1: shape (5000,), float32"),
        "large": ("rank 0: shape (4000,), float32", "rank 1: shape (4001,), float32"),
    }
    for rank, out in enumerate(results):
        for case, shapes in expected.items():
            message = out["reduce_mismatch"][case]
            assert message.startswith("reduce needs tensors of the same shape and dtype"), (
                rank,
                case,
                message,
            )
            assert all(shape in message for shape in shapes), (rank, case, message)
    for rank, out in enumerate(results):
        returned, message = out["deferred"]
        assert returned == [2.0, 2.0] + [1.0] * rank  # each process's own elements, reduced where they meet
        assert message.startswith("the previous reduce (on the device, checked when this one started) needs")
        assert "rank 0: shape (2,), float32" in message and "rank 1: shape (3,), float32" in message
    zero, one = results
    assert (
        zero["reduce_kinds"]
        == one["reduce_kinds"]
        == {
            "large mean": [1.5, 1.5],
            "int sum": [3, 20],
            "int mean": [1.5],
            "bool max": [True, False],
            "half sum": "tensor([1., 3.], dtype=torch.float16)",
            "complex sum": [(2 + 2j)],
            "matrix product": [[6.0, 6.0], [6.0, 6.0]],
        }
    )


def test_process_control(results: list[dict[str, Any]]) -> None:
    zero, one = results
    assert zero["saw_marker"] and one["saw_marker"], "the others ran the block after the main process"
    assert zero["triggers"] == one["triggers"] == (True, False)
    assert zero["calls"] == ["main", "local"] and one["calls"] == ["last", "one"]
    assert (zero["seed"], one["seed"]) == (5, 6)
