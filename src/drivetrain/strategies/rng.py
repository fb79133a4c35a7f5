"""Every random generator drivetrain touches: captured, restored and shared between processes.

The one place that reads and sets generator states, for all three uses:

* **checkpoints** (both front doors): every process's record, :func:`capture` / :func:`restore`;
* **epoch starts**: a prepared loader gives every process rank 0's generators
  (:func:`synchronize`, Accelerate's ``rng_types``), so a shuffling sampler makes one permutation;
* **loader positions**: a prepared loader's own generators (its sampler's, its ``generator=``),
  saved with its position (:func:`capture` with ``generators=``).

One record schema serves them all; each use fills the keys it needs:

* ``"python"``: Python's ``random`` module;
* ``"numpy"``: NumPy's global generator (when NumPy is installed);
* ``"torch"``: torch's CPU generator;
* ``"device"``: the hardware's own generators, through the strategy's hardware
  :class:`~drivetrain.accelerators.Accelerator` hooks (``get_rng_state``/``set_rng_state``), with
  the device type and accelerator they came from; absent when the hardware has none (the CPU);
* ``"generators"``: named ``torch.Generator`` objects (``{"sampler": …, "loader": …}``).

Restoring a ``"device"`` record on other hardware (saved on CUDA, resumed on the CPU) restores
everything else and warns, wherever the record comes from. Everything in a record is plain
tensors, numbers, strings, lists and dicts, so checkpoints load with ``torch.load(weights_only=True)``.
Checkpoints written before this schema (a top-level ``"cuda"`` entry) still restore.

Resuming on a different number of processes follows one policy, :func:`state_for_rank`: see
``docs/resuming.md``.
"""

from __future__ import annotations

import random
import warnings
from collections.abc import Collection, Iterable, Mapping, Sequence
from enum import Enum
from typing import TYPE_CHECKING, Any, TypeVar

import torch

from drivetrain.accelerators.accelerator import Accelerator

if TYPE_CHECKING:
    from drivetrain.strategies.strategy import Strategy

T = TypeVar("T")

#: The process-wide generators a checkpoint records.
PROCESS_GENERATORS = ("python", "numpy", "torch", "device")
#: Accelerate's ``rng_types`` names: torch's global generator, a device's, and the data's own.
RNG_TYPES = ("torch", "cuda", "xpu", "mps", "xla", "generator")
_DEVICE_TYPES = ("cuda", "xpu", "mps", "xla")

Generators = Mapping[str, "torch.Generator | None"]


# -- capture and restore ------------------------------------------------------------------------------
def capture(
    strategy: Strategy, kinds: Collection[str] = PROCESS_GENERATORS, generators: Generators | None = None
) -> dict[str, Any]:
    """The states of the process generators in ``kinds`` and of the named ``generators`` (``None`` ones skipped)."""
    record: dict[str, Any] = {}
    if "python" in kinds:
        version, internal, gauss = random.getstate()
        record["python"] = [version, list(internal), gauss]
    if "numpy" in kinds:
        numpy_state = _numpy_state()
        if numpy_state is not None:
            record["numpy"] = numpy_state
    if "torch" in kinds:
        record["torch"] = torch.get_rng_state()
    if "device" in kinds:
        accelerator = strategy.accelerator
        device_state = accelerator.get_rng_state()
        if device_state is not None:
            record["device"] = {
                "type": strategy.root_device.type,
                "accelerator": type(accelerator).__name__,
                "state": device_state,
            }
    if generators:
        record["generators"] = {name: g.get_state() for name, g in generators.items() if g is not None}
    return record


def restore(strategy: Strategy, record: Mapping[str, Any], generators: Generators | None = None) -> None:
    """Put the generators back as :func:`capture` found them; keys absent from ``record`` are left alone."""
    if "python" in record:
        version, internal, gauss = record["python"]
        random.setstate((version, tuple(internal), gauss))
    if "numpy" in record:
        _set_numpy_state(record["numpy"])
    if "torch" in record:
        torch.set_rng_state(record["torch"])
    device = record.get("device")
    if device is None and "cuda" in record:  # checkpoints written before the accelerator hooks
        device = {"type": "cuda", "accelerator": "CUDAAccelerator", "state": record["cuda"]}
    if device is not None:
        _restore_device(strategy, device)
    for name, state in record.get("generators", {}).items():
        generator = (generators or {}).get(name)
        if generator is not None:
            generator.set_state(state)


def _restore_device(strategy: Strategy, device: Mapping[str, Any]) -> None:
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


# -- sharing rank 0's generators (Accelerate's rng_types) --------------------------------------------------
def validate_rng_types(rng_types: Iterable[str | Enum] | None) -> tuple[str, ...]:
    """The generator names in ``rng_types`` as strings (``None`` means only the data's generator).

    Raises:
        TypeError: ``rng_types`` is a single string rather than a list of them.
        ValueError: a name that is not one of :data:`RNG_TYPES`.
    """
    if rng_types is None:
        return ("generator",)
    if isinstance(rng_types, (str, Enum)):
        raise TypeError(
            f"rng_types expects a list of generator names, got the single value {rng_types!r}. "
            f"Write rng_types=[{_name(rng_types)!r}]."
        )
    names = tuple(_name(value) for value in rng_types)
    unknown = [name for name in names if name not in RNG_TYPES]
    if unknown:
        raise ValueError(
            f"rng_types={list(names)!r} names generator(s) drivetrain cannot synchronise: "
            f"{', '.join(map(repr, unknown))}. Use any of {', '.join(map(repr, RNG_TYPES))}."
        )
    return names


def _name(value: str | Enum) -> str:
    return str(value.value) if isinstance(value, Enum) else str(value)


def unused_device_types(strategy: Strategy, rng_types: Sequence[str]) -> list[str]:
    """The device generator names in ``rng_types`` that this strategy's hardware does not have."""
    return [name for name in rng_types if name in _DEVICE_TYPES and name != strategy.root_device.type]


def _kinds(strategy: Strategy, rng_types: Sequence[str]) -> tuple[str, ...]:
    """``rng_types`` in the record's terms: ``"torch"``, and ``"device"`` for this hardware's own name."""
    kinds = ("torch",) if "torch" in rng_types else ()
    return kinds + (("device",) if strategy.root_device.type in rng_types else ())


def synchronize(strategy: Strategy, rng_types: Sequence[str], generator: torch.Generator | None) -> None:
    """Give every process rank 0's state of the generators in ``rng_types`` (a collective call).

    ``"generator"`` stands for ``generator``; a device name for the strategy's hardware generators
    when the strategy runs on that kind of device (other device names name nothing here).
    """
    if strategy.world_size == 1 or not rng_types:
        return
    generators = {"generator": generator} if "generator" in rng_types else None
    record = capture(strategy, _kinds(strategy, rng_types), generators) if strategy.is_global_zero else None
    restore(strategy, strategy.broadcast(record, src=0), generators)


# -- resuming on another number of processes ------------------------------------------------------------
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


# -- NumPy, when installed ------------------------------------------------------------------------------------
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


def _set_numpy_state(state: Mapping[str, Any]) -> None:
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
