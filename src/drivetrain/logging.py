"""``drivetrain.logging.get_logger``: a multi-process aware logger, as ``accelerate.logging.get_logger``.

>>> from drivetrain.logging import get_logger
>>> logger = get_logger(__name__)
>>> logger.info("starting")                                  # rank 0 only  # doctest: +SKIP
>>> logger.info("my shard is ready", main_process_only=False)  # every rank  # doctest: +SKIP
>>> logger.info("in turn", main_process_only=False, in_order=True)  # rank 0, then 1, ...  # doctest: +SKIP

drivetrain's own messages use the same loggers under the name ``drivetrain``: silence them with
``logging.getLogger("drivetrain").setLevel(logging.WARNING)``; set ``DRIVETRAIN_LOG_ALL_RANKS=1``
to see them from every rank. Your own loggers print what your logging configuration says
(``logging.basicConfig(level=logging.INFO)``, for instance), as with Accelerate.
"""

from __future__ import annotations

from drivetrain._utilities.log import ALL_RANKS_VARIABLE, MultiProcessAdapter, get_logger

__all__ = ["ALL_RANKS_VARIABLE", "MultiProcessAdapter", "get_logger"]
