"""Seeding every random number generator a training run touches (capturing them: :mod:`drivetrain.strategies.rng`)."""

from __future__ import annotations

import os
import random

import torch

_MAX_SEED = 2**32 - 1
_SEED_WORKERS = "DRIVETRAIN_SEED_WORKERS"


def seed_everything(seed: int | None = None, workers: bool = False) -> int:
    """Seed Python's ``random``, NumPy (when installed) and torch on every device.

    Args:
        seed: the seed; ``None`` reads ``DRIVETRAIN_GLOBAL_SEED`` or picks 0.
        workers: also seed torch, ``random`` and NumPy in every worker process of the loaders
            the front doors prepare, distinctly per worker and rank and reproducibly
            (:class:`drivetrain.data.seeding.WorkerSeeder`).

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
    os.environ[_SEED_WORKERS] = "1" if workers else "0"
    random.seed(seed)
    torch.manual_seed(seed)  # seeds every CUDA/XPU/MPS generator too
    try:
        import numpy as np
    except ImportError:
        pass
    else:
        np.random.seed(seed)
    return seed


def worker_seeding_requested() -> bool:
    """Whether ``seed_everything(workers=True)`` asked for seeded loader workers.

    Kept in the environment (like the global seed) so that processes started later by the
    launchers inherit the request.
    """
    return os.environ.get(_SEED_WORKERS, "0") == "1"
