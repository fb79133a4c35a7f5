"""CUDA, XPU, MPS and XLA accelerators with their hardware faked at torch's (or torch_xla's) boundary."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from drivetrain.accelerators import (
    CUDAAccelerator,
    MPSAccelerator,
    XLAAccelerator,
    XPUAccelerator,
    devices_for,
    resolve_accelerator,
)

# -- CUDA ---------------------------------------------------------------------------------------


def test_cuda_counts_visible_gpus(hardware: Any) -> None:
    assert CUDAAccelerator.is_available() is False
    assert CUDAAccelerator.auto_device_count() == 0
    hardware.cuda(4)
    assert CUDAAccelerator.is_available() is True
    assert CUDAAccelerator.auto_device_count() == 4


def test_cuda_parses_against_the_visible_count(hardware: Any) -> None:
    hardware.cuda(4)
    assert CUDAAccelerator.parse_devices("auto") == [0, 1, 2, 3]
    assert CUDAAccelerator.parse_devices(2) == [0, 1]
    assert CUDAAccelerator.parse_devices("1,3") == [1, 3]
    with pytest.raises(ValueError, match="asks for cuda device 4, but only 4 cuda device"):
        CUDAAccelerator.parse_devices([4])
    with pytest.raises(ValueError, match="asks for 6 cuda devices, but only 4 are visible"):
        CUDAAccelerator.parse_devices(6)


def test_cuda_devices(hardware: Any) -> None:
    hardware.cuda(4)
    accelerator = resolve_accelerator("cuda")
    assert isinstance(accelerator, CUDAAccelerator)
    assert devices_for(accelerator, "1,3") == [torch.device("cuda", 1), torch.device("cuda", 3)]
    assert devices_for(accelerator, "auto") == [torch.device("cuda", i) for i in range(4)]
    assert CUDAAccelerator.get_parallel_devices(2) == [torch.device("cuda", 0), torch.device("cuda", 1)]


def test_cuda_stats_add_named_figures(monkeypatch: pytest.MonkeyPatch, hardware: Any) -> None:
    hardware.cuda(1)
    allocator = {
        "allocated_bytes.all.current": 1024,
        "allocated_bytes.all.peak": 4096,
        "reserved_bytes.all.current": 8192,
    }
    monkeypatch.setattr(torch.cuda, "memory_stats", lambda device=None: dict(allocator))
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)

    stats = CUDAAccelerator().get_device_stats("cuda:0")

    assert stats["allocated_bytes.all.current"] == 1024
    assert stats["memory_allocated_bytes"] == 1024
    assert stats["memory_reserved_bytes"] == 8192
    assert stats["max_memory_allocated_bytes"] == 4096
    assert "device_total_bytes" not in stats  # only asked once CUDA has started


def test_cuda_rejects_other_devices() -> None:
    with pytest.raises(
        ValueError, match=r"CUDAAccelerator.setup_device got device=device\(type='cpu'\), which is not a CUDA"
    ):
        CUDAAccelerator().setup_device(torch.device("cpu"))
    with pytest.raises(ValueError, match=r"CUDAAccelerator.get_device_stats got device=device\(type='xpu'"):
        CUDAAccelerator().get_device_stats("xpu:0")


def test_cuda_unavailable_message(hardware: Any) -> None:
    with pytest.raises(
        ValueError,
        match=r"accelerator='cuda' was requested but is not available here "
        r"\(torch\.cuda\.is_available\(\) is False: .*\)\. "
        r"Available here: cpu\. Use accelerator='cpu' or 'auto'\.$",
    ):
        resolve_accelerator("cuda")


# -- XPU ----------------------------------------------------------------------------------------


def test_xpu_with_two_devices(hardware: Any) -> None:
    assert XPUAccelerator.is_available() is False
    hardware.xpu(2)
    assert XPUAccelerator.is_available() is True
    assert XPUAccelerator.auto_device_count() == 2
    assert XPUAccelerator.parse_devices(-1) == [0, 1]
    accelerator = resolve_accelerator("xpu")
    assert type(accelerator) is XPUAccelerator
    assert devices_for(accelerator, [1]) == [torch.device("xpu", 1)]
    with pytest.raises(ValueError, match="asks for 3 xpu devices, but only 2 are visible"):
        devices_for(accelerator, 3)


def test_xpu_stats_add_named_figures(monkeypatch: pytest.MonkeyPatch, hardware: Any) -> None:
    hardware.xpu(1)
    monkeypatch.setattr(torch.xpu, "memory_stats", lambda device=None: {"allocated_bytes.all.peak": 77})
    stats = XPUAccelerator().get_device_stats(torch.device("xpu", 0))
    assert stats["max_memory_allocated_bytes"] == 77
    assert stats["memory_allocated_bytes"] == 0
    with pytest.raises(ValueError, match="which is not an XPU device"):
        XPUAccelerator().setup_device(torch.device("cuda", 0))


def test_xpu_unavailable_message(hardware: Any) -> None:
    with pytest.raises(
        ValueError, match=r"accelerator='xpu' was requested .*\(torch\.xpu\.is_available\(\) is False"
    ):
        resolve_accelerator("xpu")


# -- MPS ----------------------------------------------------------------------------------------


def test_mps_on_apple_silicon(hardware: Any) -> None:
    assert MPSAccelerator.is_available() is False
    hardware.mps(True)
    assert MPSAccelerator.is_available() is True
    assert MPSAccelerator.auto_device_count() == 1
    for devices in ("auto", 1, -1, [0], "0,"):
        assert MPSAccelerator.parse_devices(devices) == [0]
    assert devices_for(resolve_accelerator("mps"), "auto") == [torch.device("mps", 0)]
    with pytest.raises(ValueError, match="asks for 2 mps devices, but only 1 are visible"):
        MPSAccelerator.parse_devices(2)


def test_mps_is_not_used_on_intel_macs(hardware: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    hardware.mps(True, machine="x86_64")
    assert MPSAccelerator.is_available() is False
    with pytest.raises(ValueError, match=r"\(MPS needs an Apple silicon Mac; this is Darwin on x86_64\)"):
        resolve_accelerator("mps")


def test_mps_stats(hardware: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    hardware.mps(True)
    monkeypatch.setattr(torch.mps, "current_allocated_memory", lambda: 10)
    monkeypatch.setattr(torch.mps, "driver_allocated_memory", lambda: 20)
    monkeypatch.setattr(torch.mps, "recommended_max_memory", lambda: 30)
    assert MPSAccelerator().get_device_stats("mps") == {
        "mps_allocated_bytes": 10,
        "mps_driver_allocated_bytes": 20,
        "mps_recommended_max_bytes": 30,
    }
    with pytest.raises(ValueError, match="which is not the MPS device"):
        MPSAccelerator().get_device_stats("cpu")


# -- XLA ----------------------------------------------------------------------------------------


def test_xla_without_torch_xla(hardware: Any) -> None:
    assert XLAAccelerator.is_available() is False
    assert XLAAccelerator.auto_device_count() == 0
    # The form can still be checked: 1, the classic host's 8, or one index.
    assert XLAAccelerator.parse_devices(1) == 1
    assert XLAAccelerator.parse_devices("8") == 8
    assert XLAAccelerator.parse_devices([5]) == [5]
    with pytest.raises(ValueError, match=r"torch_xla is not installed"):
        resolve_accelerator("tpu")


def test_xla_on_a_tpu_host(hardware: Any) -> None:
    hardware.torch_xla(device_type="TPU", count=4)
    assert XLAAccelerator.is_available() is True
    assert XLAAccelerator.auto_device_count() == 4
    assert XLAAccelerator.parse_devices(1) == 1
    assert XLAAccelerator.parse_devices(4) == 4
    assert XLAAccelerator.parse_devices(-1) == 4
    assert XLAAccelerator.parse_devices("auto") == 4
    assert XLAAccelerator.parse_devices([3]) == [3]

    accelerator = resolve_accelerator("tpu")
    assert type(accelerator) is XLAAccelerator
    assert devices_for(accelerator, "auto") == [torch.device("xla", i) for i in range(4)]
    assert devices_for(accelerator, [2]) == [torch.device("xla", 2)]
    assert devices_for(accelerator, 1) == [torch.device("xla", 0)]


@pytest.mark.parametrize(
    ("devices", "message"),
    [
        (
            8,
            r"devices=8 is not valid for accelerator='xla': XLA runs on 1 device or on all 4 devices "
            r"of this host\. "
            r"Allowed: .* Pass devices=1 or devices=4\.",
        ),
        (2, r"devices=2 is not valid .*on all 4 devices"),
        ([0, 1], r"devices=\[0, 1\] .*an index list must name exactly one device\."),
        ([4], r"devices=\[4\] asks for XLA device 4, but this host has 4 \(indices 0\.\.3\)"),
        (0, r"0 selects no device"),
    ],
)
def test_xla_rejects(hardware: Any, devices: object, message: str) -> None:
    hardware.torch_xla(count=4)
    with pytest.raises(ValueError, match=message):
        XLAAccelerator.parse_devices(devices)


def test_xla_on_other_pjrt_devices(hardware: Any) -> None:
    hardware.torch_xla(device_type="CUDA", count=2)
    assert XLAAccelerator.auto_device_count() == 2
    assert XLAAccelerator.parse_devices(2) == 2


def test_xla_that_cannot_start_is_unavailable(hardware: Any) -> None:
    hardware.torch_xla(error=RuntimeError)
    assert XLAAccelerator.is_available() is False
    hardware.torch_xla(count=0)
    assert XLAAccelerator.is_available() is False
    with pytest.raises(ValueError, match=r"torch_xla reports none on this host"):
        XLAAccelerator.parse_devices("auto")
    with pytest.raises(ValueError, match=r"torch_xla is installed but reports no XLA device"):
        resolve_accelerator("xla")


def test_xla_stats_and_setup(hardware: Any) -> None:
    hardware.torch_xla(memory_info={"bytes_used": 5, "bytes_limit": 50})
    accelerator = XLAAccelerator()
    accelerator.setup_device(torch.device("xla", 0))
    assert accelerator.get_device_stats("xla:0") == {"xla_bytes_used": 5, "xla_bytes_limit": 50}
    with pytest.raises(ValueError, match="which is not an XLA device"):
        accelerator.setup_device(torch.device("cpu"))


# -- random generators, device memory, waiting (the hooks the core's checkpoints and timers use) --


class _Generators:
    """Per-device generator states of a faked runtime, recorded as torch's device modules keep them."""

    def __init__(self, count: int) -> None:
        self.states = [torch.tensor([index], dtype=torch.uint8) for index in range(count)]
        self.initialized = True

    def get_all(self) -> list[torch.Tensor]:
        return list(self.states)

    def set(self, state: torch.Tensor, device: int = 0) -> None:
        self.states[device] = state


@pytest.mark.parametrize("kind", ["cuda", "xpu"])
def test_gpu_generators_are_saved_and_restored_device_by_device(
    hardware: Any, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    getattr(hardware, kind)(2)
    module = getattr(torch, kind)
    generators = _Generators(2)
    monkeypatch.setattr(module, "is_initialized", lambda: generators.initialized)
    monkeypatch.setattr(module, "get_rng_state_all", generators.get_all)
    monkeypatch.setattr(module, "set_rng_state", generators.set)
    accelerator = CUDAAccelerator() if kind == "cuda" else XPUAccelerator()
    saved = accelerator.get_rng_state()
    assert [int(state) for state in saved] == [0, 1]
    generators.states = [torch.tensor([9], dtype=torch.uint8)] * 2
    # Saved on a host with three devices; the two visible here get theirs back, the third is ignored.
    accelerator.set_rng_state([*saved, torch.tensor([2], dtype=torch.uint8)])
    assert [int(state) for state in generators.states] == [0, 1]
    accelerator.set_rng_state(None)  # saved before the runtime started: nothing to restore
    generators.initialized = False
    assert accelerator.get_rng_state() is None  # reading it would start the runtime


def test_mps_generator_is_saved_and_restored(hardware: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    hardware.mps(True)
    state = {"now": torch.tensor([3], dtype=torch.uint8)}
    monkeypatch.setattr(torch.mps, "get_rng_state", lambda: state["now"])
    monkeypatch.setattr(torch.mps, "set_rng_state", lambda new: state.update(now=new))
    accelerator = MPSAccelerator()
    saved = accelerator.get_rng_state()
    state["now"] = torch.tensor([7], dtype=torch.uint8)
    accelerator.set_rng_state(saved)
    assert int(state["now"]) == 3
    hardware.mps(False)
    assert accelerator.get_rng_state() is None


def test_xla_seed_is_saved_and_restored_and_synchronize_waits(hardware: Any) -> None:
    hardware.torch_xla(count=4)
    import torch_xla.core.xla_model as xm

    accelerator = XLAAccelerator()
    saved = accelerator.get_rng_state()
    xm.set_rng_state(5)
    accelerator.set_rng_state(saved)
    assert xm.get_rng_state() == saved == 101
    accelerator.synchronize()
    assert hardware.xla_waits == 1


def test_cpu_has_no_generator_of_its_own_and_nothing_to_wait_for() -> None:
    from drivetrain.accelerators import CPUAccelerator

    accelerator = CPUAccelerator()
    assert accelerator.get_rng_state() is None  # torch's CPU generator is saved for every device
    accelerator.set_rng_state(None)
    accelerator.synchronize()
    accelerator.empty_cache()
