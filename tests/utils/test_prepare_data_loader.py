"""``drivetrain.utils.prepare_data_loader`` without an Accelerator: Accelerate's standalone sharding.

Every setting of ``data_loader_cases.py`` (map-style and iterable data, 2 and 3 processes, split
and even batches, ``drop_last``) gives each process the batches the pinned Accelerate gives it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader

from drivetrain.utils import prepare_data_loader

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "compat"))
sys.path.insert(0, str(Path(__file__).parent))

import accelerate_package
import data_loader_cases


@pytest.fixture(scope="module")
def accelerate_results() -> dict[str, Any]:
    package = accelerate_package.accelerate_package()
    completed = subprocess.run(
        [sys.executable, data_loader_cases.__file__, str(package)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    return json.loads(completed.stdout.splitlines()[-1])


@pytest.mark.compat
def test_each_process_gets_the_batches_accelerate_gives_it(accelerate_results: dict[str, Any]) -> None:
    ours = data_loader_cases.compute(prepare_data_loader)
    assert ours.keys() == accelerate_results.keys()
    for setting, processes in ours.items():
        for index, (mine, theirs) in enumerate(zip(processes, accelerate_results[setting], strict=True)):
            where = f"{setting}, process {index}"
            if theirs[0] == "error":
                assert mine == theirs, where
                continue
            assert mine[0] == theirs[0], where
            # With split_batches and even_batches=False Accelerate's len() is the length of the whole
            # loader, also for a process given fewer batches; drivetrain's is what the process iterates.
            assert mine[1] in (theirs[1], len(mine[0])) and (mine[1] is None or mine[1] == len(mine[0])), (
                where
            )


def test_the_shares_of_all_processes_cover_the_data_once_without_a_process_group() -> None:
    assert not torch.distributed.is_initialized()
    shares = [
        [
            batch.tolist()
            for batch in prepare_data_loader(
                DataLoader(range(12), batch_size=2), num_processes=3, process_index=i
            )
        ]
        for i in range(3)
    ]
    assert shares == [[[0, 1], [6, 7]], [[2, 3], [8, 9]], [[4, 5], [10, 11]]]
    single = prepare_data_loader(DataLoader(range(5), batch_size=2))  # no Accelerator: one process
    assert [batch.tolist() for batch in single] == [[0, 1], [2, 3], [4]]
    assert not torch.distributed.is_initialized()


def test_settings_that_need_a_running_job_are_explained() -> None:
    loader = DataLoader(range(8), batch_size=2)
    with pytest.raises(ValueError, match=r"process_index=2\) is not one of the 2 processes"):
        prepare_data_loader(loader, num_processes=2, process_index=2)
    with pytest.raises(ValueError, match=r"num_processes=0\): give an int >= 1"):
        prepare_data_loader(loader, num_processes=0)
    with pytest.raises(ValueError, match="needs put_on_device=True"):
        prepare_data_loader(loader, dispatch_batches=True)
    with pytest.raises(ValueError, match="needs the processes of a running job"):
        prepare_data_loader(
            loader, num_processes=2, process_index=0, put_on_device=True, dispatch_batches=True
        )
    with pytest.raises(ValueError, match=r"rng_types.*needs the processes of a running job"):
        prepare_data_loader(loader, num_processes=2, process_index=1, rng_types=["torch"])
    with pytest.raises(ValueError, match="use_stateful_dataloader=True\\) is not supported"):
        prepare_data_loader(loader, use_stateful_dataloader=True)


def test_explicit_shares_do_not_depend_on_a_one_process_accelerator_being_alive() -> None:
    import drivetrain as dt

    accelerator = dt.Accelerator(cpu=True)  # alive in this process, on one process
    shares = [
        [
            batch.tolist()
            for batch in prepare_data_loader(
                DataLoader(range(8), batch_size=2), num_processes=2, process_index=i
            )
        ]
        for i in range(2)
    ]
    assert shares == [[[0, 1], [4, 5]], [[2, 3], [6, 7]]]
    assert accelerator.num_processes == 1
