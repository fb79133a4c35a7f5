"""Choosing an accelerator from ``accelerator=`` and devices from ``devices=``."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import drivetrain as dt
from drivetrain.accelerators import (
    Accelerator,
    AcceleratorRegistry,
    CPUAccelerator,
    CUDAAccelerator,
    MPSAccelerator,
    XLAAccelerator,
    XPUAccelerator,
    available_here,
    devices_for,
    resolve_accelerator,
)


class _Custom(Accelerator):
    """A user accelerator whose answers each test sets."""

    available: Any = True
    count: Any = 2
    parallel: Any = None

    @staticmethod
    def parse_devices(devices: Any) -> Any:
        return devices

    @staticmethod
    def get_parallel_devices(devices: Any) -> Any:
        if _Custom.parallel is not None:
            return _Custom.parallel
        return [torch.device("cpu")] * devices

    @staticmethod
    def auto_device_count() -> int:
        return _Custom.count

    @staticmethod
    def is_available() -> bool:
        if isinstance(_Custom.available, Exception):
            raise _Custom.available
        return bool(_Custom.available)


@pytest.fixture
def custom() -> Any:
    _Custom.available, _Custom.count, _Custom.parallel = True, 2, None
    AcceleratorRegistry.register("custom", _Custom, description="test accelerator")
    return _Custom


# -- "auto" and "gpu" ---------------------------------------------------------------------------


def test_auto_is_cpu_without_hardware(hardware: Any) -> None:
    assert type(resolve_accelerator("auto")) is CPUAccelerator


@pytest.mark.parametrize(
    ("present", "expected"),
    [
        ({"cuda": 2}, CUDAAccelerator),
        ({"mps": True}, MPSAccelerator),
        ({"xla": 8}, XLAAccelerator),
        ({"xpu": 1}, XPUAccelerator),
        ({"cuda": 1, "xpu": 2, "xla": 8}, CUDAAccelerator),
        ({"xpu": 2, "xla": 8}, XLAAccelerator),
        ({"mps": True, "xla": 8}, MPSAccelerator),
    ],
)
def test_auto_picks_the_best_present(hardware: Any, present: dict[str, Any], expected: type) -> None:
    _switch_on(hardware, present)
    assert type(resolve_accelerator("auto")) is expected
    assert type(resolve_accelerator(" Auto ")) is expected


@pytest.mark.parametrize(
    ("present", "expected"),
    [
        ({"cuda": 2}, CUDAAccelerator),
        ({"mps": True}, MPSAccelerator),
        ({"xpu": 1}, XPUAccelerator),
        ({"xpu": 1, "cuda": 1}, CUDAAccelerator),
        ({"xpu": 1, "xla": 8}, XPUAccelerator),
    ],
)
def test_gpu_means_the_gpu_backend_present(hardware: Any, present: dict[str, Any], expected: type) -> None:
    _switch_on(hardware, present)
    assert type(resolve_accelerator("gpu")) is expected


def test_gpu_without_a_gpu(hardware: Any) -> None:
    hardware.torch_xla(count=8)  # a TPU is not a GPU
    with pytest.raises(
        ValueError,
        match=r"^accelerator='gpu' was requested but no GPU backend was found here "
        r"\(looked for cuda, mps, xpu\)\. "
        r"Available here: cpu, tpu, xla\. Use accelerator='cpu', 'tpu', 'xla' or 'auto'\.$",
    ):
        resolve_accelerator("gpu")


def test_auto_uses_a_user_class_that_replaced_a_builtin(hardware: Any) -> None:
    class AlwaysXPU(_Custom):
        pass

    with pytest.warns(UserWarning, match="replaces the built-in accelerator 'xpu'"):
        AcceleratorRegistry.register("xpu", AlwaysXPU)
    assert type(resolve_accelerator("auto")) is AlwaysXPU


# -- names and instances ------------------------------------------------------------------------


def test_names_are_looked_up_in_the_registry(hardware: Any, custom: Any) -> None:
    assert type(resolve_accelerator("cpu")) is CPUAccelerator
    assert type(resolve_accelerator("CPU")) is CPUAccelerator
    assert type(resolve_accelerator("custom")) is custom


def test_unknown_name_lists_the_registered_ones(hardware: Any) -> None:
    with pytest.raises(
        ValueError,
        match=r"Unknown accelerator 'npu'\. Did you mean 'xpu'\? Available: cpu, cuda, hpu, mps, tpu, xla, xpu\.",
    ):
        resolve_accelerator("npu")


def test_an_instance_is_returned_as_is(custom: Any) -> None:
    accelerator = custom()
    assert resolve_accelerator(accelerator) is accelerator


def test_an_unavailable_instance_is_an_error(hardware: Any) -> None:
    with pytest.raises(
        ValueError, match=r"^accelerator=CUDAAccelerator\(\) was requested but is not available here"
    ):
        resolve_accelerator(CUDAAccelerator())


def test_an_unavailable_user_accelerator_names_its_check(hardware: Any, custom: Any) -> None:
    custom.available = False
    with pytest.raises(
        ValueError,
        match=r"^accelerator='custom' was requested but is not available here "
        r"\(_Custom\.is_available\(\) returned False\)\. "
        r"Available here: cpu\. Use accelerator='cpu' or 'auto'\.$",
    ):
        resolve_accelerator("custom")


class _Missing(_Custom):
    @staticmethod
    def is_available() -> bool:
        return False


def test_a_user_accelerator_explains_its_absence_through_unavailable_reason(hardware: Any) -> None:
    class Driverless(_Missing):
        @classmethod
        def unavailable_reason(cls) -> str:
            return "the vendor driver is not loaded; run `modprobe vendor`"

    with pytest.raises(
        ValueError, match=r"not available here \(the vendor driver is not loaded; run `modprobe vendor`\)"
    ):
        dt.connect(accelerator=Driverless())


def test_unavailable_reason_under_its_old_private_name_still_explains_with_a_deprecation_warning(
    hardware: Any,
) -> None:
    with pytest.warns(DeprecationWarning, match="OldStyle._unavailable_reason .* unavailable_reason"):

        class OldStyle(_Missing):
            @staticmethod
            def _unavailable_reason() -> str:
                return "no device file /dev/vendor0"

    with pytest.raises(ValueError, match=r"not available here \(no device file /dev/vendor0\)"):
        resolve_accelerator(OldStyle())


def test_an_unavailable_reason_that_raises_does_not_hide_the_error(hardware: Any) -> None:
    class Broken(_Missing):
        @classmethod
        def unavailable_reason(cls) -> str:
            raise RuntimeError("boom")

    with pytest.raises(
        ValueError, match=r"Broken.is_available\(\) returned False; unavailable_reason\(\) raised"
    ):
        resolve_accelerator(Broken())


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (3, r"accelerator=3 is a int; pass a name such as 'auto', 'cpu', 'cuda' or 'gpu', or an instance"),
        (None, r"accelerator=None is a NoneType"),
        (
            CPUAccelerator,
            r"accelerator=CPUAccelerator is a class; pass an instance, accelerator=CPUAccelerator\(\)",
        ),
        (torch.device("cpu"), r"is a device"),
    ],
)
def test_wrong_types(value: Any, message: str) -> None:
    with pytest.raises(TypeError, match=message):
        resolve_accelerator(value)


def test_available_here(hardware: Any, custom: Any) -> None:
    assert available_here() == ["cpu", "custom"]
    hardware.cuda(1)
    hardware.mps(True)
    assert available_here() == ["cpu", "cuda", "custom", "mps"]
    custom.available = RuntimeError("driver crashed")
    assert available_here() == ["cpu", "cuda", "mps"]


# -- devices_for --------------------------------------------------------------------------------


def test_devices_for_auto_asks_the_accelerator(custom: Any) -> None:
    custom.count = 3
    assert devices_for(custom(), "auto") == [torch.device("cpu")] * 3


def test_devices_for_rejects_a_non_accelerator() -> None:
    with pytest.raises(
        TypeError, match=r"devices_for\(\) needs an Accelerator instance, got 'cpu'; resolve a name"
    ):
        devices_for("cpu", 1)  # type: ignore[arg-type]


@pytest.mark.parametrize("count", [0, -1, None, True])
def test_devices_for_auto_needs_a_positive_count(custom: Any, count: Any) -> None:
    custom.count = count
    with pytest.raises(
        ValueError, match=r"devices='auto' asks _Custom\.auto_device_count\(\) how many devices"
    ):
        devices_for(custom(), "auto")


@pytest.mark.parametrize(
    ("parallel", "error", "message"),
    [
        (
            ["cpu"],
            TypeError,
            r"_Custom\.get_parallel_devices\(\) must return a list of torch\.device, got \['cpu'\]",
        ),
        (torch.device("cpu"), TypeError, r"must return a list of torch\.device"),
        ([], ValueError, r"_Custom\.get_parallel_devices\(\) returned no device for devices=1\."),
    ],
)
def test_devices_for_checks_the_answer(
    custom: Any, parallel: Any, error: type[Exception], message: str
) -> None:
    custom.parallel = parallel
    with pytest.raises(error, match=message):
        devices_for(custom(), 1)


def _switch_on(hardware: Any, present: dict[str, Any]) -> None:
    if "cuda" in present:
        hardware.cuda(present["cuda"])
    if "mps" in present:
        hardware.mps(present["mps"])
    if "xpu" in present:
        hardware.xpu(present["xpu"])
    if "xla" in present:
        hardware.torch_xla(count=present["xla"])
