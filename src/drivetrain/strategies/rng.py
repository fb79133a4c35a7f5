"""Every random generator of a process, captured for a checkpoint and restored on resume.

Both front doors save the same per-process record, made by :func:`capture_rng_states`:

* ``"python"``: Python's ``random`` module;
* ``"numpy"``: NumPy's global generator (when NumPy is installed);
* ``"torch"``: torch's CPU generator;
* ``"device"``: the hardware's own generators, through the strategy's hardware
  :class:`~drivetrain.accelerators.Accelerator` hooks (``get_rng_state``/``set_rng_state``), with
  the device type and accelerator they came from. Absent when the hardware has none (the CPU) or
  has not started yet.

Everything in it is plain tensors, numbers, strings, lists and dicts, so checkpoints load with
``torch.load(weights_only=True)``.

Resuming on a different number of processes follows one policy, :func:`state_for_rank`: see
``docs/resuming.md``.
"""

from __future__ import annotations

import random
import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import torch

from drivetrain.accelerators.accelerator import Accelerator

if TYPE_CHECKING:
    from drivetrain.strategies.strategy import Strategy

T = TypeVar("T")


def capture_rng_states(strategy: Strategy) -> dict[str, Any]:
    """This process's generator states (see the module docstring for the keys)."""
    states: dict[str, Any] = {
        "python": _python_state_to_plain(random.getstate()),
        "torch": torch.get_rng_state(),
    }
    numpy_state = _numpy_state()
    if numpy_state is not None:
        states["numpy"] = numpy_state
    accelerator = strategy.accelerator
    device_state = accelerator.get_rng_state()
    if device_state is not None:
        states["device"] = {
            "type": strategy.root_device.type,
            "accelerator": type(accelerator).__name__,
            "state": device_state,
        }
    return states


def restore_rng_states(strategy: Strategy, states: dict[str, Any]) -> None:
    """Put the generators back as :func:`capture_rng_states` found them; absent keys are left alone.

    A device record from other hardware (saved on CUDA, resumed on the CPU) is not restored, with a
    warning: the host generators are, so the run stays reproducible from here on.
    """
    if "python" in states:
        random.setstate(_plain_to_python_state(states["python"]))
    if "numpy" in states:
        _set_numpy_state(states["numpy"])
    if "torch" in states:
        torch.set_rng_state(states["torch"])
    device = states.get("device")
    if device is None and "cuda" in states:  # checkpoints written before the accelerator hooks
        device = {"type": "cuda", "accelerator": "CUDAAccelerator", "state": states["cuda"]}
    if device is not None:
        _restore_device(strategy, device)


def _restore_device(strategy: Strategy, device: dict[str, Any]) -> None:
    accelerator = strategy.accelerator
    here = strategy.root_device.type
    cannot = None
    if device["type"] != here:
        cannot = f"this run is on {here!r}"
    elif type(accelerator).set_rng_state is Accelerator.set_rng_state:
        cannot = f"{type(accelerator).__name__} does not define set_rng_state"
    if cannot is not None:
        warnings.warn(
            f"The checkpoint holds the {device['type']!r} generators of {device['accelerator']}, which are not "
            f"restored: {cannot}. Python, NumPy and torch's CPU generators are; random numbers drawn on the "
            f"device will differ from the original run.",
            UserWarning,
            stacklevel=4,
        )
        return
    accelerator.set_rng_state(device["state"])


def state_for_rank(saved: Sequence[T], rank: int, world_size: int, *, source: str) -> T:
    """The entry of the per-process list ``saved`` that process ``rank`` of ``world_size`` resumes with.

    The one policy for resuming ``N`` saved processes as ``M`` (both front doors use it): with
    ``M == N`` process ``r`` takes entry ``r``; otherwise it takes entry ``r % N`` and a warning
    (from rank 0) says the run will not repeat the original exactly.

    Args:
        saved: one entry per process of the run that wrote ``source``.
        rank: this process's global rank.
        world_size: the number of processes now.
        source: the checkpoint's path, for the warning.

    Raises:
        ValueError: ``saved`` is empty.
    """
    if not saved:
        raise ValueError(
            f"The checkpoint '{source}' holds no per-process state; it was not written by drivetrain."
        )
    saved_size = len(saved)
    if saved_size != world_size and rank == 0:
        warnings.warn(
            f"'{source}' was saved by {saved_size} process(es) and is resumed by {world_size}. Process r takes "
            f"the random generators (and data position) saved by process r % {saved_size}, so the run "
            f"does not repeat the original exactly. Resume with {saved_size} process(es) to repeat it.",
            UserWarning,
            stacklevel=3,
        )
    return saved[rank % saved_size]


def _python_state_to_plain(state: tuple[Any, ...]) -> list[Any]:
    version, internal, gauss = state
    return [version, list(internal), gauss]


def _plain_to_python_state(state: list[Any]) -> tuple[Any, ...]:
    version, internal, gauss = state
    return version, tuple(internal), gauss


def _numpy_state() -> dict[str, Any] | None:
    try:
        import numpy as np
    except ImportError:
        return None
    kind, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
    return {
        "kind": str(kind),
        "keys": torch.from_numpy(np.asarray(keys).astype("int64")),
        "pos": int(pos),
        "has_gauss": int(has_gauss),
        "cached_gaussian": float(cached),
    }


def _set_numpy_state(state: dict[str, Any]) -> None:
    try:
        import numpy as np
    except ImportError:
        warnings.warn(
            "The checkpoint holds NumPy's generator state but NumPy is not installed here; it is not restored.",
            UserWarning,
            stacklevel=4,
        )
        return
    np.random.set_state(
        (
            state["kind"],
            state["keys"].numpy().astype("uint32"),
            state["pos"],
            state["has_gauss"],
            state["cached_gaussian"],
        )
    )
