"""Evaluation and prediction on strategies whose forward is a collective (FSDP, DeepSpeed ZeRO-3)
when the processes hold different numbers of batches.

Every forward gathers the sharded weights from all processes, so all of them must run the same
number of forwards, or the busiest one waits forever. The processes agree on each loader's
largest share (one ``all_gather_object`` per loop); a process with fewer batches then runs extra
forwards on a batch it already had — or, holding none of that loader, on one sent by the process
with the most — and discards what they return and log. No hook is called for them, so callbacks
and metrics see exactly the real batches, and the results equal a one-process run's.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from drivetrain._utilities.apply import move_to_device
from drivetrain.trainer.results import ResultCollection

if TYPE_CHECKING:
    from drivetrain.trainer.trainer import Trainer

_LIMITS = {"test": "limit_test_batches", "predict": "limit_predict_batches"}


class Padding:
    """How many extra forwards this process runs after each loader; nothing to do on other strategies."""

    def __init__(self, trainer: Trainer, module: Any, lengths: list[float], what: str) -> None:
        self.trainer = trainer
        self.module = module
        self.lengths = lengths
        count = len(lengths)
        self.extra = [0] * count
        self.sources: list[int | None] = [None] * count
        strategy = trainer.strategy
        if strategy.world_size == 1 or not strategy.forward_is_collective:
            return
        counts = strategy.all_gather_object([float(length) for length in lengths])
        if all(shares == counts[0] for shares in counts):
            return
        if any(math.isinf(share) for shares in counts for share in shares):
            raise RuntimeError(
                f"The {what} loaders give the {strategy.world_size} processes different numbers of batches "
                f"(per process and loader: {counts}), and a loader without a length cannot be evened out in "
                f"advance, but {type(strategy).__name__} gathers the sharded weights in every forward, so all "
                f"processes must run the same number. Give the loader a length, or set "
                f"{_LIMITS.get(what, 'limit_val_batches')} to a number of batches every process has."
            )
        for index in range(count):
            shares = [shares[index] for shares in counts]
            most = max(shares)
            self.extra[index] = int(most - lengths[index])
            if min(shares) == 0 < most:
                self.sources[index] = shares.index(most)

    def shared_batch(self, index: int, loader: Any) -> Any:
        """A batch for a process with none of loader ``index`` (every process calls this before the loop)."""
        source = self.sources[index]
        if source is None:
            return None

        strategy = self.trainer.strategy
        batch = move_to_device(next(iter(loader)), "cpu") if strategy.global_rank == source else None
        batch = strategy.broadcast(batch, src=source)
        return strategy.batch_to_device(batch) if self.lengths[index] == 0 else None

    def run(self, index: int, step: Any, batch: Any, extra: tuple[Any, ...]) -> None:
        """The extra forwards after loader ``index``, on ``batch``, with their outputs and logged values dropped."""
        count = self.extra[index]
        if not count:
            return
        module = self.module
        strategy = self.trainer.strategy
        kept = module._results
        # Values logged with sync_dist on each step still cross processes, as the busier process expects.
        dropped = ResultCollection(False, strategy.all_reduce, strategy.all_gather_object)
        dropped.batch_level = True
        module._results = dropped
        try:
            for _ in range(count):
                dropped.batch = batch
                step(batch, 0, *extra)
        finally:
            module._results = kept
