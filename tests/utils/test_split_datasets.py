"""``split_between_processes`` of a Hugging Face ``datasets.Dataset``: each process's share is a ``Dataset``.

``datasets`` is not a drivetrain dependency; it comes from the conformance environment (where
Accelerate's own scripts find it, tests/compat), as a user's installed copy would. The shares
are computed per rank without processes (the sharing is pure logic); the conformance suite runs
Accelerate's ``test_split_between_processes_dataset`` on 2 real processes.
"""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from drivetrain.utils.collectives import split_between_processes

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "compat"))

import accelerate_package

pytestmark = pytest.mark.compat


@pytest.fixture(scope="module")
def Dataset() -> type:
    accelerate_package.add_user_packages(accelerate_package.accelerate_package())
    from datasets import Dataset

    return Dataset


def _shares(data: object, processes: int, apply_padding: bool) -> list[object]:
    shares = []
    for rank in range(processes):
        strategy = SimpleNamespace(world_size=processes, global_rank=rank)
        with split_between_processes(strategy, data, apply_padding=apply_padding) as share:  # type: ignore[arg-type]
            shares.append(share)
    return shares


def test_each_process_gets_a_contiguous_dataset_and_padding_repeats_its_last_row(Dataset: type) -> None:
    data = Dataset.from_list([{"k": v} for v in range(5)])
    shares = _shares(data, 2, apply_padding=False)
    assert [type(share) for share in shares] == [Dataset, Dataset]
    assert [share["k"] for share in shares] == [[0, 1, 2], [3, 4]]
    assert [share["k"] for share in _shares(data, 2, apply_padding=True)] == [[0, 1, 2], [3, 4, 4]]
    # More processes than rows: the last ones get nothing, or the last row when padded.
    small = Dataset.from_list([{"k": 7}])
    assert [share["k"] for share in _shares(small, 2, apply_padding=False)] == [[7], []]
    assert [share["k"] for share in _shares(small, 2, apply_padding=True)] == [[7], [7]]
    # A dict of datasets of one length is split value by value.
    both = {"a": data, "b": list(range(5))}
    first = _shares(both, 2, apply_padding=False)[0]
    assert (first["a"]["k"], first["b"]) == ([0, 1, 2], [0, 1, 2])
