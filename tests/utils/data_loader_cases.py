"""Each process's batches from Accelerate's free ``prepare_data_loader(dl, num_processes=, process_index=, ...)``.

    python data_loader_cases.py SITE/accelerate     # prints Accelerate's results as JSON

run on drivetrain's interpreter with the pinned ``accelerate`` imported from its folder, in a
process of its own and without an Accelerator (Accelerate's standalone use);
``test_prepare_data_loader.py`` computes the same cases with ``drivetrain.utils`` and compares.
"""

from __future__ import annotations

import itertools
import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from torch.utils.data import DataLoader, IterableDataset


class Numbers(IterableDataset[int]):
    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.n))


def settings() -> Iterator[dict[str, Any]]:
    for iterable, n, batch_size, processes, split, even, drop_last in itertools.product(
        (False, True), (7, 10, 12), (2, 3, 4), (2, 3), (False, True), (True, False), (False, True)
    ):
        yield {
            "iterable": iterable,
            "n": n,
            "batch_size": batch_size,
            "num_processes": processes,
            "split_batches": split,
            "even_batches": even,
            "drop_last": drop_last,
        }


def compute(prepare: Callable[..., Any]) -> dict[str, Any]:
    """Setting -> per process: its batches and its length, or the error raised."""
    results: dict[str, Any] = {}
    for setting in settings():
        per_process: list[Any] = []
        for index in range(setting["num_processes"]):
            dataset: Any = Numbers(setting["n"]) if setting["iterable"] else list(range(setting["n"]))
            loader = DataLoader(dataset, batch_size=setting["batch_size"], drop_last=setting["drop_last"])
            try:
                prepared = prepare(
                    loader,
                    num_processes=setting["num_processes"],
                    process_index=index,
                    split_batches=setting["split_batches"],
                    even_batches=setting["even_batches"],
                )
                batches = [batch.tolist() for batch in prepared]
                length = None if setting["iterable"] else len(prepared)
                per_process.append([batches, length])
            except (ValueError, TypeError) as error:
                per_process.append(["error", type(error).__name__])
        results[json.dumps(setting, sort_keys=True)] = per_process
    return json.loads(json.dumps(results))


if __name__ == "__main__":
    sys.path.append(str(Path(sys.argv[1]).parent))
    from accelerate.data_loader import prepare_data_loader

    print(json.dumps(compute(prepare_data_loader)))
