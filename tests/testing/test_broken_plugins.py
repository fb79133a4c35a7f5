"""Each deliberately broken plugin (tests/testing/broken_plugins.py) is caught, and the kit names what to fix.

The contract checks catch most defects in this process, in well under a second each; a strategy
whose barrier does not wait needs two processes and runs the kit's programs on them.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from drivetrain.testing import (
    PluginCheckError,
    Status,
    check_accelerator,
    check_checkpoint_io,
    check_cluster_environment,
    check_precision,
    check_strategy,
)

B = "testing.broken_plugins"
JOB = {"KIT_RANK": "{rank}", "KIT_SIZE": "{world_size}", "KIT_PORT": "{port}"}

#: id -> (check, target, options, failing row, what went wrong (regex), what to implement (regex)).
BROKEN: dict[str, tuple[Any, str, dict[str, Any], str, str, str]] = {
    "accelerator with string devices": (
        check_accelerator,
        f"{B}:StringDevicesAccelerator",
        {},
        "accelerator: get_parallel_devices() gives one torch.device per process",
        r"must return a list of torch\.device, got \['xpu:0'\]",
        r"return a list of torch\.device, one per process",
    ),
    "accelerator with instance methods": (
        check_accelerator,
        f"{B}:InstanceMethodAccelerator",
        {},
        "accelerator: the seeds' four methods are static",
        r"auto_device_count, is_available must be static methods",
        r"@staticmethod",
    ),
    "accelerator counting in text": (
        check_accelerator,
        f"{B}:CountAsTextAccelerator",
        {},
        "accelerator: auto_device_count() counts the devices",
        r"auto_device_count\(\) returned '2'",
        r"as an int",
    ),
    "accelerator without RNG state hooks": (
        check_accelerator,
        f"{B}:ForgetfulHPUAccelerator",
        {"fake": True},
        "accelerator: random generators saved and restored",
        r"get_rng_state\(\) returns None, but the device has random generators of its own \(the habana_frameworks",
        r"implement get_rng_state\(\) .* and set_rng_state\(state\)",
    ),
    "accelerator that saves but never restores its generator": (
        check_accelerator,
        f"{B}:SaveOnlyRNGAccelerator",
        {"fake": True},
        "accelerator: random generators saved and restored",
        r"get_rng_state\(\) is overridden but set_rng_state\(\) is not",
        r"set_rng_state\(state\) that restores it",
    ),
    "accelerator whose generator state checkpoints cannot hold": (
        check_accelerator,
        f"{B}:GeneratorObjectAccelerator",
        {"fake": True},
        "accelerator: random generators saved and restored",
        r"get_rng_state\(\) returned Generator, which checkpoints cannot hold",
        r"plain tensors, numbers, lists, dicts",
    ),
    "checkpoint IO that writes non-atomically": (
        check_checkpoint_io,
        f"{B}:NonAtomicCheckpointIO",
        {},
        "checkpoint IO: a crash during save leaves the old or the new checkpoint",
        r"a process killed at file-system call \d+ of \d+ of save_checkpoint\(\) left a checkpoint that "
        r"load_checkpoint\(\) cannot read",
        r"write to a temporary file next to the target and rename it over the target",
    ),
    "checkpoint IO that drops a key": (
        check_checkpoint_io,
        f"{B}:KeyDroppingCheckpointIO",
        {},
        "checkpoint IO: load_checkpoint returns what save_checkpoint wrote",
        r"the loaded checkpoint lacks the key\(s\) 'rng'",
        r"write and read every key and value unchanged",
    ),
    "checkpoint IO that loads nothing as an empty checkpoint": (
        check_checkpoint_io,
        f"{B}:LenientCheckpointIO",
        {},
        "checkpoint IO: loading where nothing was saved is an error",
        r"returned dict instead of raising FileNotFoundError",
        r"raise FileNotFoundError naming the path",
    ),
    "strategy that swallows its checkpoint IO": (
        check_strategy,
        f"{B}:PluginSwallowingStrategy",
        {},
        "strategy: takes its plugins in the constructor",
        r"given_plugins\(\) does not report the checkpoint_io passed to the constructor",
        r"pass them to super\(\)\.__init__",
    ),
    "strategy whose declaration lies": (
        check_strategy,
        f"{B}:WrongDeclarationStrategy",
        {},
        "strategy: one-process set-up matches wraps_models",
        r"wraps_models=True, but setup_module\(\) returned the module itself",
        r"declare wraps_models = True exactly when setup_module\(\) returns a wrapper",
    ),
    "precision that never unscales": (
        check_precision,
        f"{B}:NeverUnscalesPrecision",
        {},
        "precision: gradients are unscaled before clipping",
        r"after unscale_gradients\(\), the gradient of weight is \d{4,}\.\d times the true one \(pre_backward "
        r"scaled the loss by \d{4,}\)",
        r"divide the gradients by the loss scale in unscale_gradients\(optimizer\)",
    ),
    "precision whose state checkpoints cannot hold": (
        check_precision,
        f"{B}:ScalerObjectPrecision",
        {},
        "precision: state_dict() survives a checkpoint",
        r"state_dict\(\) holds what checkpoints cannot",
        r"return plain tensors and numbers from state_dict\(\)",
    ),
    "precision that forgets the optimizer step": (
        check_precision,
        f"{B}:StepSwallowingPrecision",
        {},
        "precision: optimizer_step() steps or reports a skip",
        r"optimizer_step\(\) left the parameters unchanged without reporting a skipped step",
        r"call optimizer\.step\(\)",
    ),
    "precision that halves the module but not the inputs": (
        check_precision,
        f"{B}:HalvingPrecision",
        {},
        "precision: the forward pass runs on converted inputs",
        r"raised RuntimeError: .*(dtype|Half|Float)",
        r"make convert_input\(\) cast the batch",
    ),
    "environment reporting the wrong world size": (
        check_cluster_environment,
        f"{B}:WrongWorldSizeEnvironment",
        {"env": JOB},
        "cluster environment: each process learns its rank and the world size",
        r"world_size\(\) returned 1 in a job of 2 processes \(rank 0, KIT_RANK=0, KIT_SIZE=2",
        r"read world_size\(\), global_rank\(\), local_rank\(\) and node_rank\(\) from the scheduler's variables",
    ),
    "environment that does not detect its job": (
        check_cluster_environment,
        f"{B}:UndetectedEnvironment",
        {"env": JOB},
        "cluster environment: detect() sees the job",
        r"detect\(\) returned False for rank 0 under the job's variables",
        r"return True from detect\(\) when the scheduler's variables are set",
    ),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_a_broken_plugin_is_caught_with_what_to_fix(case: str) -> None:
    check, target, options, row_name, reason, fix = BROKEN[case]
    report = check(target, whole_programs=False, **options)
    row = report.row(row_name)
    assert row.status is Status.FAILED, f"{case}: {row}\n{report}"
    assert re.search(reason, row.reason), f"{case}: {row.reason!r}"
    assert re.search(fix, row.fix), f"{case}: {row.fix!r}"
    # The failure is in the table, and a test using the report fails with the same words.
    assert row_name in report.table() and "failed" in report.table()
    with pytest.raises(PluginCheckError, match=re.escape(row_name)):
        report.raise_for_failures()


@pytest.mark.multiprocess
@pytest.mark.timeout(400)
def test_a_strategy_that_forgets_barrier_is_caught_on_two_processes(tmp_path: Any) -> None:
    report = check_strategy(f"{B}:NoBarrierStrategy", processes=[2], cli=False, root=tmp_path)
    row = report.row("2 processes: the strategy's collectives (all_reduce, all_gather, broadcast, barrier …)")
    assert row.status is Status.FAILED, report.table()
    assert "barrier: barrier() returned on rank 0 before rank 1 reached it" in row.reason
    assert "torch.distributed's all_reduce, all_gather, broadcast_object_list, barrier" in row.fix
    # The contract checks (one process, no barrier to miss) pass: only the programs find it.
    assert not [r for r in report.failures if r.name.startswith("strategy:")], report.table()
