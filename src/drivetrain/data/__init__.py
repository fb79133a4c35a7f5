"""Data loading across processes: sharding, dispatching, look-ahead and resumable positions.

Shared by the front doors: :func:`prepare_data_loader` turns a user's ``DataLoader`` into the
:class:`PreparedDataLoader` each process iterates.
"""

from drivetrain.data.batches import batch_length, batch_mover, concatenate_batches, pad_batch, slice_batch
from drivetrain.data.dispatch import DispatchingDataLoader
from drivetrain.data.iterable import IterableDatasetShard
from drivetrain.data.loader import ActiveLoaders, PreparedDataLoader, ShardedDataLoader
from drivetrain.data.prepare import prepare_data_loader, skip_first_batches
from drivetrain.data.rng import RNG_TYPES, validate_rng_types
from drivetrain.data.samplers import ShardedBatchSampler

__all__ = [
    "RNG_TYPES",
    "ActiveLoaders",
    "DispatchingDataLoader",
    "IterableDatasetShard",
    "PreparedDataLoader",
    "ShardedBatchSampler",
    "ShardedDataLoader",
    "batch_length",
    "batch_mover",
    "concatenate_batches",
    "pad_batch",
    "prepare_data_loader",
    "skip_first_batches",
    "slice_batch",
    "validate_rng_types",
]
