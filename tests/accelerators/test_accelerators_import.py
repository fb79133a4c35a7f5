"""Importing drivetrain.accelerators is cheap: built-ins registered, no torch_xla, no CUDA context."""

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
            if name.split(".")[0] == "torch_xla":
                looked_up.append(name)
            return None

    sys.meta_path.insert(0, Recorder())

    import torch
    import drivetrain.accelerators as accelerators

    assert looked_up == [], looked_up
    assert "torch_xla" not in sys.modules
    assert not torch.cuda.is_initialized()
    print(",".join(accelerators.AcceleratorRegistry.available_accelerators()))
    """
)


def test_import_registers_builtins_without_touching_optional_hardware() -> None:
    result = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "cpu,cuda,mps,tpu,xla,xpu"


def test_public_names() -> None:
    assert sorted(accelerators.__all__) == [
        "Accelerator",
        "AcceleratorRegistry",
        "CPUAccelerator",
        "CUDAAccelerator",
        "MPSAccelerator",
        "XLAAccelerator",
        "XPUAccelerator",
        "available_here",
        "devices_for",
        "resolve_accelerator",
    ]
    for name in accelerators.__all__:
        assert getattr(accelerators, name) is not None
