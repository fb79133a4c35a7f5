"""Data loading across processes: sharding, dispatching, look-ahead and resumable positions.

Shared by the front doors: :func:`prepare_data_loader` turns a user's ``DataLoader`` into the
:class:`PreparedDataLoader` each process iterates; shuffling depends only on ``(seed, epoch)``
(:class:`SeedableRandomSampler`), and loader workers are seeded per worker and rank on request
(:class:`WorkerSeeder`).
"""

from drivetrain.data.batches import batch_length, concatenate_batches, pad_batch, slice_batch
from drivetrain.data.dispatch import DispatchingDataLoader
from drivetrain.data.iterable import IterableDatasetShard
from drivetrain.data.loader import ActiveLoaders, PreparedDataLoader, ShardedDataLoader
from drivetrain.data.passthrough import PassThroughBatches
from drivetrain.data.prepare import (
    can_prepare,
    prepare_data_loader,
    skip_first_batches,
    uses_distributed_sampler,
)
from drivetrain.data.samplers import ShardedBatchSampler
from drivetrain.data.seeding import SeedableRandomSampler, WorkerSeeder, epoch_seed
from drivetrain.data.skipping import SkipBatchSampler, SkipDataLoader
from drivetrain.strategies.rng import RNG_TYPES, validate_rng_types

__all__ = [
    "RNG_TYPES",
    "ActiveLoaders",
    "DispatchingDataLoader",
    "IterableDatasetShard",
    "PassThroughBatches",
    "PreparedDataLoader",
    "SeedableRandomSampler",
    "ShardedBatchSampler",
    "ShardedDataLoader",
    "SkipBatchSampler",
    "SkipDataLoader",
    "WorkerSeeder",
    "batch_length",
    "can_prepare",
    "concatenate_batches",
    "epoch_seed",
    "pad_batch",
    "prepare_data_loader",
    "skip_first_batches",
    "slice_batch",
    "uses_distributed_sampler",
    "validate_rng_types",
]
