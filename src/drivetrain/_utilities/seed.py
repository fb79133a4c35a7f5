"""Seeding every random number generator a training run touches (capturing them: :mod:`drivetrain.strategies.rng`)."""

from __future__ import annotations

import os
import random

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
