"""The tuner: a learning rate (range test) and a batch size (largest that fits) found before training.

``Tuner`` runs each search in a short fit; the ``LearningRateFinder`` and ``BatchSizeFinder``
callbacks run the same searches when a fit starts. Each name is imported on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from drivetrain._utilities.lazy import lazy_exports

if TYPE_CHECKING:  # pragma: no cover - what type checkers and IDEs see for the lazy names below
    from drivetrain.trainer.tuner.batch_size import BatchSizeTrial
    from drivetrain.trainer.tuner.lr_finder import LRFinder
    from drivetrain.trainer.tuner.memory_limit import MemoryLimitExceeded
    from drivetrain.trainer.tuner.tuning import Tuner

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "BatchSizeTrial": "drivetrain.trainer.tuner.batch_size",
        "LRFinder": "drivetrain.trainer.tuner.lr_finder",
        "MemoryLimitExceeded": "drivetrain.trainer.tuner.memory_limit",
        "Tuner": "drivetrain.trainer.tuner.tuning",
    },
)

__all__ = ["BatchSizeTrial", "LRFinder", "MemoryLimitExceeded", "Tuner"]
