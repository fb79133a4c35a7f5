"""Process-wide torch settings a run asks for, set for the run and put back afterwards."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

import torch

_CUBLAS_VARIABLE = "CUBLAS_WORKSPACE_CONFIG"


@contextmanager
def torch_flags(
    deterministic: bool | str | None, benchmark: bool | None, device: torch.device
) -> Iterator[None]:
    """Apply ``deterministic`` / ``benchmark`` for the duration of a run.

    ``deterministic`` turns on ``torch.use_deterministic_algorithms`` (``"warn"``: warn
    instead of failing on non-deterministic operations) and, unless the user chose otherwise,
    switches cuDNN's benchmark mode off, since it picks kernels by timing.
    """
    previous_algorithms = torch.are_deterministic_algorithms_enabled()
    previous_warn = torch.is_deterministic_algorithms_warn_only_enabled()
    previous_benchmark = torch.backends.cudnn.benchmark
    previous_cublas = os.environ.get(_CUBLAS_VARIABLE)
    try:
        if deterministic is not None:
            torch.use_deterministic_algorithms(bool(deterministic), warn_only=deterministic == "warn")
            if deterministic and device.type == "cuda" and previous_cublas is None:
                # cuBLAS needs a fixed workspace to be deterministic (PyTorch's reproducibility notes).
                os.environ[_CUBLAS_VARIABLE] = ":4096:8"
        if benchmark is not None:
            torch.backends.cudnn.benchmark = benchmark
        elif deterministic:
            torch.backends.cudnn.benchmark = False
        yield
    finally:
        torch.use_deterministic_algorithms(previous_algorithms, warn_only=previous_warn)
        torch.backends.cudnn.benchmark = previous_benchmark
        if previous_cublas is None:
            os.environ.pop(_CUBLAS_VARIABLE, None)
