"""Random numbers in the data path that depend only on ``(seed, epoch)``, and seeded loader workers.

* :class:`SeedableRandomSampler` shuffles each epoch from a seed derived from ``(seed, epoch)``:
  the same seed and epoch give the same order in every process and every run, whatever was drawn
  before, and :meth:`~SeedableRandomSampler.set_epoch` goes back to any epoch's order.
* :func:`epoch_seed` is that derivation, also used for the generator a prepared loader gives
  its worker processes (so their seeds too depend on ``(seed, epoch, rank)`` only).
* :class:`WorkerSeeder` is the ``worker_init_fn`` that seeds torch, ``random`` and NumPy in each
  loader worker from the worker's base seed, its id and the process's rank (so the ranks'
  workers differ), when ``seed_everything(workers=True)`` asked for it.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable, Iterator, Sized
from typing import Any

import numpy as np
import torch
from torch.utils.data import RandomSampler

_SEED_LIMIT = 2**63  # torch.Generator.manual_seed takes any int below 2**64; stay positive as an int64


def epoch_seed(seed: int, epoch: int, *streams: int) -> int:
    """A seed for ``epoch`` of a run seeded with ``seed`` (and optional further stream numbers, a rank).

    Different ``(seed, epoch, *streams)`` give unrelated seeds (unlike ``seed + epoch``, where
    seed 1 at epoch 0 would repeat seed 0 at epoch 1).
    """
    key = "/".join(str(int(part)) for part in (seed, epoch, *streams)).encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little") % _SEED_LIMIT


class SeedableRandomSampler(RandomSampler):
    """A ``RandomSampler`` whose order depends only on its seed and the epoch.

    Each iteration reseeds the generator from ``(initial_seed, epoch)`` and then moves to the next
    epoch, so ``set_epoch(e)`` brings back epoch ``e``'s order. Processes that share the seed draw
    the same permutation (prepared loaders agree on rank 0's seed), which they then share out.

    Args:
        data_source: the dataset to draw indices of.
        replacement: draw with replacement.
        num_samples: how many indices per epoch (default: the dataset's length).
        generator: the generator to reseed each epoch (a new one when omitted).
        data_seed: the seed (default: ``torch.initial_seed()``, so ``set_seed`` decides).
    """

    def __init__(
        self,
        data_source: Sized,
        replacement: bool = False,
        num_samples: int | None = None,
        generator: torch.Generator | None = None,
        *,
        data_seed: int | None = None,
    ) -> None:
        super().__init__(data_source, replacement=replacement, num_samples=num_samples, generator=generator)
        if data_seed is not None and (isinstance(data_seed, bool) or not isinstance(data_seed, int)):
            raise TypeError(
                f"data_seed must be an int or None, got {type(data_seed).__name__} {data_seed!r}."
            )
        #: The seed every epoch's order is derived from.
        self.initial_seed: int = data_seed if data_seed is not None else torch.initial_seed()
        #: The epoch the next iteration draws the order of.
        self.epoch = 0

    def __iter__(self) -> Iterator[int]:
        # Runs at the first index, not at iter(): DataLoader's worker iterator calls iter() twice.
        if self.generator is None:
            self.generator = torch.Generator()
        self.generator.manual_seed(epoch_seed(self.initial_seed, self.epoch))
        yield from super().__iter__()
        self.epoch += 1

    def set_epoch(self, epoch: int) -> None:
        """Make the next iteration draw ``epoch``'s order."""
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise ValueError(f"set_epoch expects an int >= 0, got {epoch!r}.")
        self.epoch = epoch


class WorkerSeeder:
    """``worker_init_fn`` seeding torch, ``random`` and NumPy in a loader worker, then calling the user's.

    torch seeds worker ``i``'s generators from ``base + i``, where ``base`` is drawn from the
    loader's generator (or torch's global one) at each ``iter()``. Ranks whose loaders share a
    generator, or whose global generators were seeded alike (``seed_everything(7)`` on every
    rank), hand their workers the same seeds: every rank then applies the same random
    augmentations. This derives all three from ``(base, worker id, rank)``, so workers of
    different ranks differ, and two runs with the same seeds agree. A class rather than a
    closure, so spawned workers can unpickle it.

    Args:
        rank: the process's global rank.
        user_fn: the loader's own ``worker_init_fn``, called afterwards (it has the last word).
    """

    def __init__(self, rank: int, user_fn: Callable[[int], Any] | None = None) -> None:
        self.rank = rank
        self.user_fn = user_fn

    def __call__(self, worker_id: int) -> None:
        base = torch.initial_seed() - worker_id
        sequence = np.random.SeedSequence([base % 2**64, worker_id, self.rank])
        torch_seed, python_seed = sequence.generate_state(2, dtype=np.uint64).tolist()
        torch.manual_seed(torch_seed)
        random.seed(python_seed)
        np.random.seed(sequence.generate_state(4))
        if self.user_fn is not None:
            self.user_fn(worker_id)

    def __repr__(self) -> str:
        return f"WorkerSeeder(rank={self.rank}, user_fn={self.user_fn!r})"
