"""Accelerator names that are not registered but that users still meet, each with its history and replacement."""

from __future__ import annotations

RETIRED_ACCELERATORS: dict[str, str] = {
    "ipu": (
        "accelerator='ipu' (Graphcore IPUs, through Graphcore's PopTorch) is not available: Lightning moved IPU "
        "support out to the lightning-graphcore package in 2.0, and PopTorch is no longer maintained, so there "
        "is no PyTorch backend for IPUs to run on. Train on another accelerator (accelerator='auto' picks what "
        "is here), or register your own with AcceleratorRegistry.register('ipu', YourAccelerator)."
    ),
}
"""The accelerator registry's ``retired=`` names."""
