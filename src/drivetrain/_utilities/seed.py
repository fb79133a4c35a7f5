"""Seeding and capturing every random number generator a training run touches."""

from __future__ import annotations

import os
import random
from typing import Any

import torch

_MAX_SEED = 2**32 - 1


def seed_everything(seed: int | None = None, workers: bool = False) -> int:
    """Seed Python's ``random``, NumPy (when installed) and torch on every device.

    Args:
        seed: the seed; ``None`` reads ``DRIVETRAIN_GLOBAL_SEED`` or picks 0.
        workers: also derive distinct, reproducible seeds for data-loader workers
            (through ``DRIVETRAIN_SEED_WORKERS``, read by :func:`worker_init_function`).

    Returns:
        The seed that was used.
    """
    if seed is None:
        seed = int(os.environ.get("DRIVETRAIN_GLOBAL_SEED", 0))
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed must be an int, got {type(seed).__name__} {seed!r}.")
    if not 0 <= seed <= _MAX_SEED:
        raise ValueError(f"seed must be between 0 and {_MAX_SEED} (what NumPy accepts), got {seed}.")
    os.environ["DRIVETRAIN_GLOBAL_SEED"] = str(seed)
    os.environ["DRIVETRAIN_SEED_WORKERS"] = "1" if workers else "0"
    random.seed(seed)
    torch.manual_seed(seed)  # seeds every CUDA/XPU/MPS generator too
    try:
        import numpy as np
    except ImportError:
        pass
    else:
        np.random.seed(seed)
    return seed


def worker_init_function(worker_id: int, rank: int = 0) -> None:
    """Give each data-loader worker of each rank its own reproducible seed."""
    base = torch.initial_seed() % _MAX_SEED
    seed = (base + 7919 * rank + worker_id) % _MAX_SEED
    random.seed(seed)
    try:
        import numpy as np
    except ImportError:
        return
    np.random.seed(seed)


def collect_rng_states() -> dict[str, Any]:
    """The state of every generator, in a form ``torch.load(weights_only=True)`` accepts."""
    states: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "python": _python_state_to_plain(random.getstate()),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states["cuda"] = torch.cuda.get_rng_state_all()
    try:
        import numpy as np
    except ImportError:
        return states
    kind, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
    states["numpy"] = {
        "kind": str(kind),
        "keys": torch.from_numpy(np.asarray(keys).astype("int64")),
        "pos": int(pos),
        "has_gauss": int(has_gauss),
        "cached_gaussian": float(cached),
    }
    return states


def restore_rng_states(states: dict[str, Any]) -> None:
    """Undo :func:`collect_rng_states`; generators absent from ``states`` are left alone."""
    if "torch" in states:
        torch.set_rng_state(states["torch"])
    if "python" in states:
        random.setstate(_plain_to_python_state(states["python"]))
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])
    if "numpy" in states:
        import numpy as np

        s = states["numpy"]
        np.random.set_state(
            (s["kind"], s["keys"].numpy().astype("uint32"), s["pos"], s["has_gauss"], s["cached_gaussian"])
        )


def _python_state_to_plain(state: tuple[Any, ...]) -> list[Any]:
    version, internal, gauss = state
    return [version, list(internal), gauss]


def _plain_to_python_state(state: list[Any]) -> tuple[Any, ...]:
    version, internal, gauss = state
    return version, tuple(internal), gauss
