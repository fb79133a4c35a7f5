"""CUDAAccelerator on a real GPU; skipped where CUDA is absent."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch

from drivetrain.accelerators import CUDAAccelerator, devices_for, resolve_accelerator

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def test_availability_checks_leave_cuda_uninitialised() -> None:
    # A fresh process: this one may already have started CUDA. A started CUDA would break fork.
    probe = textwrap.dedent(
        """
        import torch
        from drivetrain.accelerators import CUDAAccelerator
        assert CUDAAccelerator.is_available()
        assert CUDAAccelerator.auto_device_count() >= 1
        CUDAAccelerator.parse_devices(-1)
        assert not torch.cuda.is_initialized()
        """
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


def test_setup_stats_and_teardown_on_a_real_gpu() -> None:
    accelerator = resolve_accelerator("cuda")
    assert isinstance(accelerator, CUDAAccelerator)
    count = torch.cuda.device_count()
    assert devices_for(accelerator, -1) == [torch.device("cuda", i) for i in range(count)]

    device = devices_for(accelerator, [count - 1])[0]
    accelerator.setup_device(device)
    assert torch.cuda.current_device() == count - 1

    before = accelerator.get_device_stats(device)["memory_allocated_bytes"]
    block = torch.ones(16 * 2**20, device=device)  # 64 MiB
    accelerator.synchronize(device)
    stats = accelerator.get_device_stats(device)
    assert stats["memory_allocated_bytes"] - before >= 64 * 2**20
    assert stats["max_memory_allocated_bytes"] >= stats["memory_allocated_bytes"]
    assert stats["memory_reserved_bytes"] >= stats["memory_allocated_bytes"]
    assert stats["allocated_bytes.all.current"] == stats["memory_allocated_bytes"]
    assert 0 < stats["device_free_bytes"] < stats["device_total_bytes"]

    del block
    reserved_with_cache = torch.cuda.memory_reserved(device)
    accelerator.teardown()
    assert torch.cuda.memory_reserved(device) <= reserved_with_cache - 64 * 2**20


def test_gpu_generators_come_back_through_the_hooks() -> None:
    accelerator = CUDAAccelerator()
    torch.rand(1, device="cuda")  # CUDA has started
    saved = accelerator.get_rng_state()
    assert len(saved) == torch.cuda.device_count()
    first = torch.rand(4, device="cuda")
    accelerator.set_rng_state(saved)
    assert torch.equal(torch.rand(4, device="cuda"), first)
    accelerator.synchronize()
    accelerator.empty_cache()
