"""What a run puts in place for its duration and takes away afterwards: torch's process-wide flags, the
profiler, and the compiled forward of a module given to ``fit`` through ``torch.compile``."""

from __future__ import annotations

import os
import types
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from drivetrain.profilers import Profiler
    from drivetrain.strategies.strategy import Strategy
    from drivetrain.trainer.trainer import Trainer

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


@contextmanager
def profiling(trainer: Trainer, profiler: Profiler | None, stage: str) -> Iterator[None]:
    """The run's profiler set up for ``stage`` in this process; its report when the stage ends."""
    if profiler is None:
        yield
        return
    strategy = trainer.strategy
    profiler.setup(stage, strategy.global_rank, strategy.world_size, trainer.log_dir)
    try:
        yield
    finally:
        try:
            profiler.describe()
        finally:
            profiler.teardown(stage)


@contextmanager
def compiled_forward(module: torch.nn.Module, compiler: Any) -> Iterator[None]:
    """``module.forward`` compiled by ``compiler`` (from the ``torch.compile`` module given to an entry
    point) for the run: ``self(x)`` in the steps runs the compiled code, as in Lightning 2.x."""
    if compiler is None:
        yield
        return
    module.__dict__["forward"] = compiler(types.MethodType(type(module).forward, module))
    try:
        yield
    finally:
        module.__dict__.pop("forward", None)


def release_strategy(strategy: Strategy) -> None:
    """What the strategy holds for an entry point that has ended, released in this process."""
    if strategy.launcher is not None and strategy.launcher.runs_in_spawned_processes:
        strategy.teardown()  # this process is a spawned rank, and ends with the entry point
        return
    # This process goes on with the script: its next entry point (fit, then test) and calls such as
    # save_checkpoint() in between need the process group and a sharded model's device mesh, as in
    # Lightning. Release the plugins only; the strategy leaves the group at exit (or at teardown()).
    strategy.precision.teardown()
    strategy.checkpoint_io.teardown()
