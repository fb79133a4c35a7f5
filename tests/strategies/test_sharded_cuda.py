"""FSDP and DeepSpeed on a real CUDA GPU over NCCL (one rank: the lent machines have one GPU).

Skipped where no GPU is present. What one rank still checks for real: NCCL set-up, bf16
``MixedPrecisionPolicy`` (the gathered weights compute in bfloat16 on the GPU), CPU offload that
actually moves the shards to host memory, meta-device init materialised on the GPU, sharded
checkpoints resuming exactly, and DeepSpeed engines (bf16, stage 3 with offload) on CUDA. The
work runs in a spawned process (see ``helpers.sharded_cuda``).
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from drivetrain._utilities.imports import package_available
from helpers import sharded_cuda as work
from helpers.sharded import reference_run

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def _in_fresh_process(function: Callable[..., Any], *args: Any) -> Any:
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        return pool.apply(function, args)


def test_fsdp_bf16_offload_meta_init_and_sharded_resume(tmp_path: Path) -> None:
    observed = _in_fresh_process(work.fsdp_bf16_offload_meta_init_resume, str(tmp_path))
    assert observed["backend"] == "nccl" and observed["built_on_meta"]
    assert observed["shard_device"] == "cpu"  # offloaded shards live in host memory
    assert observed["gathered"] == (torch.bfloat16, "cuda")  # gathered onto the GPU in bfloat16
    assert observed["resumed_exactly"]


def test_fsdp_fp32_on_the_gpu_matches_the_cpu_reference() -> None:
    losses = _in_fresh_process(work.fsdp_fp32_losses, 3)
    reference = reference_run(3, world_size=1)["losses"]
    # GPU and CPU kernels sum in different orders (and may use TF32): close, not equal.
    assert losses == pytest.approx([step[0] for step in reference], abs=1e-2)


@pytest.mark.deepspeed
@pytest.mark.skipif(not package_available("deepspeed"), reason="needs the deepspeed extra")
@pytest.mark.parametrize(
    ("name", "precision"), [("deepspeed_stage_2", "bf16-mixed"), ("deepspeed_stage_3_offload", None)]
)
def test_deepspeed_on_the_gpu(name: str, precision: str | None) -> None:
    observed = _in_fresh_process(work.deepspeed_losses, name, precision)
    assert observed["device"] == "cuda"
    assert observed["dtype"] is (torch.bfloat16 if precision else torch.float32)
    reference = [step[0] for step in reference_run(6, world_size=1)["losses"]]
    assert observed["losses"] == pytest.approx(reference, abs=5e-2 if precision else 1e-2)
