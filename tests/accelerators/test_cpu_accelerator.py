"""The CPU accelerator: process counts, devices and real memory/utilisation figures."""

from __future__ import annotations

import time

import pytest
import torch

from drivetrain.accelerators import CPUAccelerator, devices_for


def test_contract() -> None:
    assert CPUAccelerator.is_available() is True
    assert CPUAccelerator.auto_device_count() == 1
    assert CPUAccelerator.parse_devices("auto") == 1
    assert CPUAccelerator.parse_devices("3") == 3
    assert CPUAccelerator.get_parallel_devices(2) == [torch.device("cpu"), torch.device("cpu")]


def test_devices_for_cpu() -> None:
    assert devices_for(CPUAccelerator(), "auto") == [torch.device("cpu")]
    assert devices_for(CPUAccelerator(), 3) == [torch.device("cpu")] * 3


def test_indices_explain_that_devices_counts_processes() -> None:
    with pytest.raises(ValueError, match="`devices` is the number of processes to start"):
        CPUAccelerator.parse_devices([0, 1])
    with pytest.raises(ValueError, match="`devices` is the number of processes to start"):
        devices_for(CPUAccelerator(), -1)


def test_setup_device_rejects_other_devices() -> None:
    CPUAccelerator().setup_device(torch.device("cpu"))
    with pytest.raises(
        ValueError, match=r"got device=device\(type='cuda', index=0\), which is not a CPU device"
    ):
        CPUAccelerator().setup_device(torch.device("cuda", 0))


def test_memory_figures_follow_an_allocation() -> None:
    accelerator = CPUAccelerator()
    before = accelerator.get_device_stats("cpu")
    block = torch.ones(16 * 2**20)  # 64 MiB, written so the pages are resident
    after = accelerator.get_device_stats("cpu")

    assert isinstance(before["cpu_rss_bytes"], int) and before["cpu_rss_bytes"] > 0
    assert after["cpu_rss_bytes"] - before["cpu_rss_bytes"] >= 48 * 2**20
    assert after["cpu_peak_rss_bytes"] >= after["cpu_rss_bytes"]
    assert after["cpu_peak_rss_bytes"] >= before["cpu_peak_rss_bytes"]
    del block


def test_utilisation_reflects_work_since_the_previous_call() -> None:
    accelerator = CPUAccelerator()
    accelerator.get_device_stats("cpu")
    deadline = time.monotonic() + 0.3
    spins = 0
    while time.monotonic() < deadline:
        spins += 1
    busy = accelerator.get_device_stats("cpu")["cpu_percent"]
    time.sleep(0.3)
    idle = accelerator.get_device_stats("cpu")["cpu_percent"]

    assert spins > 0
    assert busy > 5.0
    assert 0.0 <= idle < busy
