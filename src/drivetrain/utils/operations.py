"""Accelerate's free helper functions: seeding, and collectives outside an ``Accelerator`` method.

The collectives need to know the processes of the run, which the ``Accelerator`` knows: they use
the most recently created live ``drivetrain.Accelerator`` in this process (see
:mod:`drivetrain.utils.current`; there is no global state to set up or reset, create the
Accelerator first).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch

from drivetrain._utilities.apply import move_to_device
from drivetrain._utilities.rank_zero import global_rank
from drivetrain._utilities.seed import seed_everything
from drivetrain.utils import collectives
from drivetrain.utils.current import current_strategy

if TYPE_CHECKING:
    from drivetrain.strategies.strategy import Strategy


def set_seed(seed: int, device_specific: bool = False, deterministic: bool = False) -> int:
    """Seed Python's ``random``, NumPy and torch (every device) for reproducible runs.

    Args:
        seed: the seed.
        device_specific: add this process's rank to the seed, so processes draw different numbers.
        deterministic: also make torch use deterministic algorithms
            (``torch.use_deterministic_algorithms(True)``; slower, and errors for operations that
            have none).

    Returns:
        The seed used in this process.
    """
    if device_specific:
        strategy = current_strategy()
        seed += strategy.global_rank if strategy is not None else global_rank()
    used = seed_everything(seed)
    if deterministic:
        torch.use_deterministic_algorithms(True)
    return used


def _strategy(function: str) -> Strategy:
    strategy = current_strategy()
    if strategy is None:
        raise RuntimeError(
            f"drivetrain.utils.{function} needs to know the processes of this run, which the Accelerator knows, "
            f"but no drivetrain.Accelerator exists in this process. Create one first (or call the Accelerator "
            f"method of the same name)."
        )
    return strategy


def gather(tensor: Any) -> Any:
    """Concatenate tensors (nested allowed) from all processes along the first dimension."""
    return collectives.gather(_strategy("gather"), tensor)


def gather_object(object: Any) -> Any:
    """Gather picklable objects from all processes (lists are concatenated)."""
    return collectives.gather_object(_strategy("gather_object"), object)


def reduce(tensor: Any, reduction: str = "mean", scale: float = 1.0) -> Any:
    """Reduce tensors (nested allowed) over all processes: ``"mean"`` (default here), ``"sum"``, ``"max"``,
    ``"min"``, ``"product"``, or ``"none"``."""
    return collectives.reduce(_strategy("reduce"), tensor, reduction, scale)


def pad_across_processes(tensor: Any, dim: int = 0, pad_index: int = 0, pad_first: bool = False) -> Any:
    """Pad tensors (nested allowed) to their largest size along ``dim`` on any process."""
    return collectives.pad_across_processes(
        _strategy("pad_across_processes"), tensor, dim, pad_index, pad_first
    )


def broadcast(tensor: Any, from_process: int = 0) -> Any:
    """``from_process``'s value of ``tensor`` (nested allowed) on every process.

    In debug mode (``Accelerator(debug=True)``, ``ACCELERATE_DEBUG_MODE=1``) every process must
    give tensors of the same shapes and dtypes, as Accelerate requires.
    """
    strategy = _strategy("broadcast")
    if strategy.world_size > 1 and getattr(strategy, "debug_collectives", False):
        collectives.check_same_layout(strategy, "broadcast", tensor)
    return strategy.broadcast(tensor, src=from_process)


def broadcast_object_list(object_list: list[Any], from_process: int = 0) -> list[Any]:
    """Replace the contents of ``object_list`` by ``from_process``'s, in place; returns the list."""
    object_list[:] = _strategy("broadcast_object_list").broadcast(list(object_list), src=from_process)
    return object_list


def wait_for_everyone() -> None:
    """Block until every process reaches this point."""
    _strategy("wait_for_everyone").barrier()


def synchronize_rng_states(rng_types: Any, generator: torch.Generator | None = None) -> None:
    """Give every process the main process's state of the generators named in ``rng_types``.

    ``rng_types``: ``"torch"``, ``"generator"`` (then pass ``generator``), or the device's own
    (``"cuda"``, ``"xpu"``, ``"mps"``, ``"xla"``, read through the hardware accelerator's RNG
    hooks). A collective call: every process must make it.
    """
    from drivetrain.strategies import rng

    names = rng.validate_rng_types(rng_types)
    if "generator" in names and generator is None:
        raise ValueError("synchronize_rng_states(['generator'], ...) needs the generator: pass generator=...")
    rng.synchronize(_strategy("synchronize_rng_states"), names, generator)


def synchronize_rng_state(rng_type: Any = None, generator: torch.Generator | None = None) -> None:
    """:func:`synchronize_rng_states` for one generator name."""
    if rng_type is None:
        raise ValueError(
            "synchronize_rng_state needs rng_type: 'torch', 'generator', 'cuda', 'xpu', 'mps' or 'xla'."
        )
    synchronize_rng_states([rng_type], generator)


def send_to_device(
    tensor: Any, device: torch.device | str, non_blocking: bool = False, skip_keys: Any = None
) -> Any:
    """Move every tensor in ``tensor`` (nested allowed) to ``device``; dict entries under ``skip_keys`` stay."""
    if skip_keys is None:
        return move_to_device(tensor, device, non_blocking=non_blocking)
    skip = {skip_keys} if isinstance(skip_keys, str) else set(skip_keys)
    if isinstance(tensor, Mapping):
        return type(tensor)(  # type: ignore[call-arg]
            {
                key: value if key in skip else send_to_device(value, device, non_blocking, skip_keys)
                for key, value in tensor.items()
            }
        )
    return move_to_device(tensor, device, non_blocking=non_blocking)
