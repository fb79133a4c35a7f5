"""Which of Accelerate's test scripts run, how, and what each sub-test is expected to do on CPU.

A sub-test is a function of the script that its ``main()`` calls (found by reading ``main``'s
source, so a new sub-test in a later Accelerate shows up by itself), plus :attr:`Script.extras`:
sub-tests ``main()`` only runs on GPUs that run on CPU processes just as well. Every sub-test is
expected to pass, except where this file says otherwise, with the reason:

* :class:`NotApplicable`: it cannot run here (it needs CUDA, a Hugging Face download, a number
  of processes) or returns at once on CPU; it must still not fail where it is called.
* ``differs``: drivetrain differs from Accelerate on purpose; it is expected to fail.
* ``known_gaps``: a gap not closed yet; it is expected to fail, and passing makes the test ask
  for the entry to go (so this list only shrinks).
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any


@dataclasses.dataclass(frozen=True)
class Reason:
    """Why a sub-test does not apply, or why drivetrain differs, at the given numbers of processes."""

    text: str
    world_sizes: tuple[int, ...] = (1, 2)


NotApplicable = Differs = Reason


@dataclasses.dataclass(frozen=True)
class Extra:
    """A call of a sub-test ``main()`` skips on CPU, made by the runner before ``main()``."""

    function: str
    kwargs: dict[str, Any]
    world_sizes: tuple[int, ...] = (1, 2)


@dataclasses.dataclass(frozen=True)
class Script:
    """One of Accelerate's test scripts and what the conformance run expects of it."""

    name: str
    path: str  # inside the installed accelerate package
    world_sizes: tuple[int, ...]
    helpers: frozenset[str] = frozenset()  # functions main() calls that are not sub-tests
    extras: tuple[Extra, ...] = ()
    labels: dict[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    not_applicable: dict[str, Reason] = dataclasses.field(default_factory=dict)
    differs: dict[str, Reason] = dataclasses.field(default_factory=dict)
    known_gaps: dict[str, str] = dataclasses.field(default_factory=dict)
    stub_modules: tuple[str, ...] = ()  # Hugging Face libraries imported at the top, used only by n/a parts
    script_not_applicable: dict[int, str] = dataclasses.field(default_factory=dict)


ONE_PROCESS = (1,)
TWO_PROCESSES = (2,)
_GPU_ONLY = "returns at once unless the run is on GPUs (DistributedType.MULTI_GPU) or TPUs (XLA)"


_BOOLS = (True, False)
_SYNC_COMBINATIONS = [
    {"split_batches": split, "dispatch_batches": dispatch, "sync_each_batch": each}
    for split, dispatch, each in itertools.product(_BOOLS, _BOOLS, _BOOLS)
]

SCRIPTS: tuple[Script, ...] = (
    Script(
        name="test_ops",
        path="test_utils/scripts/test_ops.py",
        world_sizes=(1, 2),
        not_applicable={
            "test_reduce_sum": NotApplicable("written for exactly 2 processes: returns at once", ONE_PROCESS),
            "test_reduce_mean": NotApplicable(
                "written for exactly 2 processes: returns at once", ONE_PROCESS
            ),
            "test_reduce_max": NotApplicable("written for exactly 2 processes: returns at once", ONE_PROCESS),
            "test_op_checker": NotApplicable(
                "checks shape mismatches between processes: returns at once with one", ONE_PROCESS
            ),
            "test_copy_tensor_to_devices": NotApplicable(_GPU_ONLY),
        },
    ),
    Script(
        name="test_sync",
        path="test_utils/scripts/test_sync.py",
        world_sizes=(1, 2),
        # main() runs these combinations on GPUs only; they need nothing a CPU lacks.
        extras=tuple(
            Extra("test_gradient_accumulation", combination, TWO_PROCESSES)
            for combination in _SYNC_COMBINATIONS
        )
        + tuple(
            Extra("test_gradient_accumulation_with_opt_and_scheduler", combination, TWO_PROCESSES)
            for combination in _SYNC_COMBINATIONS
            if any(combination.values())
        ),
        not_applicable={
            "test_noop_sync": NotApplicable(
                "checks that no_sync changes nothing in a single process; main() runs it only there",
                TWO_PROCESSES,
            ),
            "test_distributed_sync": NotApplicable(
                "checks no_sync between processes; main() runs it only with several", ONE_PROCESS
            ),
            "test_distributed_sync_multiple_fwd": NotApplicable(
                "checks no_sync between processes; main() runs it only with several", ONE_PROCESS
            ),
            "test_gradient_accumulation": NotApplicable(
                "asserts that gradients differ between processes inside a window: needs several", ONE_PROCESS
            ),
        },
    ),
    Script(
        name="test_script",
        path="test_utils/scripts/test_script.py",
        world_sizes=(1, 2),
        not_applicable={
            "check_seedable_sampler_in_batch_sampler_shard": NotApplicable(
                "main() runs it with several processes only", ONE_PROCESS
            ),
        },
        differs={
            "test_reinstantiated_state": Differs(
                "asserts that AcceleratorState._reset_state() breaks an Accelerator that already exists (a "
                "process-wide singleton reset under its feet); drivetrain has no singleton to reset: each "
                "Accelerator owns its state, so prepare() keeps working"
            ),
        },
    ),
    Script(
        name="test_distributed_data_loop",
        path="test_utils/scripts/test_distributed_data_loop.py",
        world_sizes=(2,),
        helpers=frozenset({"create_accelerator"}),
        labels={
            "test_data_loader": (
                "shuffle=False",
                "shuffle=True",
                "batch_sampler=BatchSampler",
                "sampler=BatchSampler, batch_size=None",
            )
        },
        script_not_applicable={1: "the script asserts that it runs on exactly 2 processes"},
    ),
    Script(
        name="test_metrics",
        path="test_utils/scripts/external_deps/test_metrics.py",
        world_sizes=(1, 2),
        stub_modules=("datasets", "evaluate", "transformers"),
        # main() runs these on GPUs only; they are torch-only and run on CPU processes as well.
        extras=(
            Extra("test_gather_for_metrics_with_iterable_dataset", {}),
            Extra("test_gather_for_metrics_with_non_tensor_objects_iterable_dataset", {}),
        ),
        labels={
            "test_torch_metrics": (
                "split_batches=True, dispatch_batches=True",
                "split_batches=True, dispatch_batches=False",
                "split_batches=False, dispatch_batches=True",
                "split_batches=False, dispatch_batches=False",
                "even split",
            )
        },
        not_applicable={
            "test_mrpc": NotApplicable(
                "downloads a BERT model, the GLUE MRPC data set and the `evaluate` metric from the Hugging Face Hub "
                "(not reachable here; not torch-only)"
            ),
        },
        differs={
            "test_gather_for_metrics_with_iterable_dataset": Differs(
                "asserts the class of the prepared loader: Accelerate dispatches an iterable data set even to a "
                "single process; drivetrain has nobody to dispatch to there and returns its plain prepared loader "
                "(the same batches, and gather_for_metrics gives all 30 items); with 2 processes it dispatches",
                ONE_PROCESS,
            ),
        },
    ),
)

BY_NAME = {script.name: script for script in SCRIPTS}


def matches(key: str, subtest: str) -> bool:
    """Whether a manifest key (a function name or a full sub-test id) names ``subtest``."""
    return subtest == key or subtest.split("(", 1)[0].split("[", 1)[0] == key


def lookup(table: dict[str, Any], subtest: str) -> Any:
    """The entry of ``table`` for ``subtest``: its full id first, then its function name."""
    if subtest in table:
        return table[subtest]
    for key, value in table.items():
        if matches(key, subtest):
            return value
    return None
