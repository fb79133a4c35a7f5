"""Batch-sampler-level sharding: which indices each process gets, how many batches, and the repeats."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest
from torch.utils.data import BatchSampler, SequentialSampler

from drivetrain.data import IterableDatasetShard, ShardedBatchSampler


def _shards(
    size: int, batch: int, n: int, *, split: bool, drop_last: bool, even: bool
) -> list[ShardedBatchSampler]:
    return [
        ShardedBatchSampler(
            BatchSampler(SequentialSampler(range(size)), batch, drop_last),
            n,
            rank,
            split_batches=split,
            even_batches=even,
        )
        for rank in range(n)
    ]


def _rounds(shards: list[ShardedBatchSampler]) -> list[list[list[int]]]:
    per_rank = [list(shard) for shard in shards]
    return [list(step) for step in zip(*per_rank)]


@pytest.mark.parametrize("split", [False, True])
@pytest.mark.parametrize("n", [2, 3])
def test_even_batches_cover_the_dataset_once_plus_repeats_from_its_start(split: bool, n: int) -> None:
    batch = 12 if split else 16
    shards = _shards(99, batch, n, split=split, drop_last=False, even=True)
    rounds = _rounds(shards)
    lengths = {len(shard) for shard in shards}
    assert lengths == {len(rounds)}, "every process takes part in every step, and len() says how many"
    assert all(len(b) == (batch // n if split else batch) for step in rounds for b in step)
    seen = [i for step in rounds for b in step for i in b]
    padding = shards[0].padding
    assert padding == len(seen) - 99 > 0
    assert seen[:99] == list(range(99)), "real items come first, in order, before the repeats"
    assert seen[99:] == list(range(padding)), "the repeats are the first items of the epoch"


def test_whole_batches_go_round_robin() -> None:
    shards = _shards(64, 8, 2, split=False, drop_last=False, even=True)
    assert list(shards[0]) == [list(range(i, i + 8)) for i in range(0, 64, 16)]
    assert list(shards[1]) == [list(range(i, i + 8)) for i in range(8, 64, 16)]
    assert shards[0].padding == 0


def test_split_batches_cut_each_batch_in_equal_slices() -> None:
    shards = _shards(32, 8, 2, split=True, drop_last=False, even=True)
    assert list(shards[0]) == [list(range(i, i + 4)) for i in range(0, 32, 8)]
    assert list(shards[1]) == [list(range(i, i + 4)) for i in range(4, 32, 8)]


@pytest.mark.parametrize("split", [False, True])
def test_drop_last_ends_all_processes_at_the_same_full_step(split: bool) -> None:
    shards = _shards(99, 16, 2, split=split, drop_last=True, even=True)
    rounds = _rounds(shards)
    assert [len(shard) for shard in shards] == [len(rounds)] * 2
    seen = [i for step in rounds for b in step for i in b]
    assert seen == list(range(96)) and shards[0].padding == 0
    # 5 full batches over 2 processes: the odd one cannot be shared and is dropped for both.
    odd = _shards(90, 16, 2, split=False, drop_last=True, even=True)
    assert [len(list(shard)) for shard in odd] == [2, 2] == [len(shard) for shard in odd]


def test_uneven_batches_give_the_remainder_to_the_first_processes() -> None:
    whole = _shards(99, 16, 2, split=False, drop_last=False, even=False)
    assert [len(list(s)) for s in whole] == [len(s) for s in whole] == [4, 3]
    assert [i for s in whole for b in s for i in b] != [] and sorted(
        i for s in whole for b in s for i in b
    ) == list(range(99))
    split = _shards(99, 16, 2, split=True, drop_last=False, even=False)
    assert (
        [len(list(s)) for s in split] == [len(s) for s in split] == [7, 6]
    )  # the last 3 items all go to rank 0
    assert sorted(i for s in split for b in s for i in b) == list(range(99))


def test_a_dataset_smaller_than_one_step_is_repeated_to_fill_it() -> None:
    shards = _shards(5, 4, 3, split=False, drop_last=False, even=True)
    rounds = _rounds(shards)
    assert len(rounds) == 1 and [len(b) for b in rounds[0]] == [4, 4, 4]
    assert [i for b in rounds[0] for i in b] == [0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 0, 1]


class _VaryingBatches:
    """A batch sampler with no fixed batch size (sizes 3, 1, 2, 3, 1 …)."""

    def __iter__(self) -> Iterator[list[int]]:
        start = 0
        for size in (3, 1, 2, 3, 1):
            yield list(range(start, start + size))
            start += size

    def __len__(self) -> int:
        return 5


def test_custom_batch_samplers_keep_their_batches() -> None:
    uneven = [ShardedBatchSampler(_VaryingBatches(), 2, r, even_batches=False) for r in range(2)]
    assert [list(s) for s in uneven] == [[[0, 1, 2], [4, 5], [9]], [[3], [6, 7, 8]]]
    even = [ShardedBatchSampler(_VaryingBatches(), 2, r) for r in range(2)]
    assert [list(s) for s in even] == [[[0, 1, 2], [4, 5], [9]], [[3], [6, 7, 8], [0, 1, 2]]]
    assert even[0].padding == 3
    with pytest.raises(ValueError, match="split_batches=True needs a batch sampler with a fixed batch_size"):
        ShardedBatchSampler(_VaryingBatches(), 2, 0, split_batches=True)


def test_split_batches_rejects_a_batch_size_processes_cannot_share() -> None:
    with pytest.raises(
        ValueError, match=r"cuts each batch of 10 into 3 equal parts.*multiple of 3 \(e\.g\. 12\)"
    ):
        _shards(30, 10, 3, split=True, drop_last=False, even=True)


def test_start_at_skips_indices_once() -> None:
    shard = _shards(64, 8, 2, split=False, drop_last=False, even=True)[1]
    full = list(shard)
    shard.start_at = 3
    assert list(shard) == full[3:]
    assert list(shard) == full, "the skip applies to one iteration only"
    single = ShardedBatchSampler(BatchSampler(SequentialSampler(range(20)), 4, False))
    single.start_at = 4
    assert list(single) == [[16, 17, 18, 19]]


@pytest.mark.parametrize("drop_last", [False, True])
def test_iterable_shards_share_chunks_and_repeat_to_fill_the_last(drop_last: bool) -> None:
    shards = [IterableDatasetShard(range(11), 2, 3, rank, drop_last=drop_last) for rank in range(3)]
    outputs = [list(shard) for shard in shards]
    if drop_last:
        assert outputs == [[0, 1], [2, 3], [4, 5]] and shards[0].padding == 0
        return
    assert outputs == [[0, 1, 6, 7], [2, 3, 8, 9], [4, 5, 10, 0]]
    assert shards[2].padding == 1
    chained = list(itertools.chain.from_iterable(zip(*[iter(o) for o in outputs])))
    assert sorted(chained) == sorted([*range(11), 0])
