"""Importing drivetrain.accelerators is cheap: built-ins registered, no torch_xla or habana_frameworks, no CUDA context."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import drivetrain.accelerators as accelerators

PROBE = textwrap.dedent(
    """
    import sys

    looked_up = []

    class Recorder:
        # Sees every lookup of torch_xla, including importlib.util.find_spec, and lets it go on.
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("torch_xla", "habana_frameworks"):
                looked_up.append(name)
            return None

    sys.meta_path.insert(0, Recorder())

    import torch
    import drivetrain.accelerators as accelerators

    assert looked_up == [], looked_up
    assert "torch_xla" not in sys.modules and "habana_frameworks" not in sys.modules
    assert not torch.cuda.is_initialized()
    print(",".join(accelerators.AcceleratorRegistry.available_accelerators()))
    """
)


def test_import_registers_builtins_without_touching_optional_hardware() -> None:
    result = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "cpu,cuda,hpu,mps,tpu,xla,xpu"


def test_public_names() -> None:
    assert sorted(accelerators.__all__) == [
        "Accelerator",
        "AcceleratorRegistry",
        "CPUAccelerator",
        "CUDAAccelerator",
        "HPUAccelerator",
        "MPSAccelerator",
        "XLAAccelerator",
        "XPUAccelerator",
        "available_here",
        "devices_for",
        "resolve_accelerator",
    ]
    for name in accelerators.__all__:
        assert getattr(accelerators, name) is not None


FIRST_REGISTRATION = textwrap.dedent(
    """
    import warnings

    import torch
    from drivetrain.accelerators import Accelerator, AcceleratorRegistry
    from drivetrain.strategies import DDPStrategy, StrategyRegistry

    warnings.simplefilter("always")
    with warnings.catch_warnings(record=True) as caught:
        class XPUAccelerator(Accelerator):  # the seed's example: its own "xpu", before any lookup
            parse_devices = staticmethod(lambda devices: devices)
            get_parallel_devices = staticmethod(lambda devices: [torch.device("cpu")] * devices)
            auto_device_count = staticmethod(lambda: 1)
            is_available = staticmethod(lambda: True)

            @classmethod
            def register_accelerators(cls, accelerator_registry):
                accelerator_registry.register("xpu", cls)

        class MyDDP(DDPStrategy):
            pass

        StrategyRegistry.register("ddp", MyDDP)
    print(AcceleratorRegistry.entry("xpu").cls.__module__, StrategyRegistry.entry("ddp").cls.__module__)
    print(AcceleratorRegistry.entry("cpu").cls.__name__, StrategyRegistry.entry("ddp_spawn").cls.__name__)
    print(sorted(str(w.message).split(" (")[0] for w in caught))
    """
)


def test_a_users_class_registered_before_any_lookup_replaces_the_builtin_with_a_warning() -> None:
    # The built-ins are imported on the first lookup; a user's registration must not come before them.
    result = subprocess.run(
        [sys.executable, "-c", FIRST_REGISTRATION], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    modules, builtins, warned = result.stdout.strip().splitlines()
    assert modules == "__main__ __main__"
    assert builtins == "CPUAccelerator DDPStrategy"
    assert warned == str(
        [
            "MyDDP replaces the built-in strategy 'ddp'",
            "XPUAccelerator replaces the built-in accelerator 'xpu'",
        ]
    )
