"""Batch-size scaling: the largest batch that fits, found by short training trials.

Each trial sets the batch size (the module's or DataModule's ``batch_arg_name`` attribute or
``hparams`` entry, which its ``train_dataloader()`` reads), builds the loaders again and trains
``steps_per_trial`` optimizer steps from the same starting state. A trial that runs out of device
memory does not fit; on the CPU, one whose measured footprint exceeds ``max_memory`` does not fit
(see :mod:`~drivetrain.trainer.tuner.memory_limit`). The search itself is
:func:`drivetrain.utils.memory.search_batch_size`, built on ``find_executable_batch_size``.
Afterwards the training state is restored and the fit's loaders use the batch size found.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from drivetrain._utilities.log import get_logger
from drivetrain.trainer.tuner.attributes import get_attribute, has_attribute, set_attribute
from drivetrain.trainer.tuner.memory_limit import (
    Footprint,
    MemoryLimitExceeded,
    measure_cpu_footprint,
    parse_memory,
    resident_bytes,
)
from drivetrain.trainer.tuner.trial import prepare_steps, reload_train_data, train_steps, tuning_session
from drivetrain.utils.memory import search_batch_size

if TYPE_CHECKING:
    from drivetrain.trainer.module import TrainingModule
    from drivetrain.trainer.trainer import Trainer


@dataclass(frozen=True)
class BatchSizeTrial:
    """One trial of the search: the batch size, whether it fitted, and (with ``max_memory``) its footprint."""

    batch_size: int
    fits: bool
    footprint: Footprint | None = None


def check_scale_arguments(
    mode: Any,
    steps_per_trial: Any,
    init_val: Any,
    max_trials: Any,
    batch_arg_name: Any,
    max_memory: Any,
    margin: Any = 0.05,
    max_val: Any = 8192,
) -> int | None:
    """Raise a clear error for settings the search cannot use; returns ``max_memory`` in bytes."""
    if mode not in ("power", "binsearch"):
        raise ValueError(
            f"mode={mode!r}; use 'power' (double until it does not fit) or 'binsearch' (then bisect to the largest)."
        )
    if isinstance(margin, bool) or not isinstance(margin, (int, float)) or not 0.0 <= margin < 1.0:
        raise ValueError(
            f"margin={margin!r}; use a fraction in [0, 1) (binsearch keeps that much below the size found)."
        )
    for name, value in (
        ("steps_per_trial", steps_per_trial),
        ("init_val", init_val),
        ("max_trials", max_trials),
        ("max_val", max_val),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}={value!r}; use an int >= 1.")
    if not isinstance(batch_arg_name, str) or not batch_arg_name:
        raise ValueError(
            f"batch_arg_name={batch_arg_name!r}; name the attribute the train_dataloader() reads."
        )
    return parse_memory(max_memory)


def check_one_process(world_size: int) -> None:
    if world_size > 1:
        raise ValueError(
            f"Batch-size scaling runs in one process; this Trainer runs {world_size}. Find the batch size "
            f"with devices=1 (per-process batch sizes are the same), then train with it."
        )


def scale_batch_size(
    trainer: Trainer,
    module: TrainingModule,
    *,
    mode: str = "power",
    steps_per_trial: int = 3,
    init_val: int = 2,
    max_trials: int = 25,
    batch_arg_name: str = "batch_size",
    max_memory: int | str | None = None,
    margin: float = 0.05,
    max_val: int = 8192,
    trials: list[BatchSizeTrial] | None = None,
) -> int:
    """Find the largest batch size that fits, inside the current fit (from ``on_fit_start``).

    The training state is restored afterwards; the attribute holds the size found (in binsearch mode
    reduced by ``margin``, as Lightning does) and the fit's loaders are built with it. No size above
    ``max_val`` or the data set's size is tried. ``trials``, when given, receives one record per trial.
    """
    limit = check_scale_arguments(
        mode, steps_per_trial, init_val, max_trials, batch_arg_name, max_memory, margin, max_val
    )
    datamodule = trainer.datamodule
    check_one_process(trainer.world_size)
    if limit is not None and trainer.strategy.root_device.type != "cpu":
        raise ValueError(
            f"max_memory={max_memory!r} limits the memory of a CPU run; this one trains on "
            f"{trainer.strategy.root_device}, where the search stops at the device's own out-of-memory error. "
            f"Leave max_memory out."
        )
    if "train" in trainer.run_state.data.given:
        raise ValueError(
            "Batch-size scaling builds the training loader again for each trial, so it cannot use a loader "
            "passed to fit(train_dataloaders=...). Build it in the module's or DataModule's train_dataloader() "
            f"with batch_size=self.{batch_arg_name}."
        )
    if not has_attribute(module, datamodule, batch_arg_name):
        raise AttributeError(
            f"Batch-size scaling sets {batch_arg_name!r}, but neither {type(module).__name__} nor its DataModule has "
            f"an attribute or hparams entry of that name. Add it and read it in train_dataloader(), or pass "
            f"batch_arg_name=..."
        )
    original = get_attribute(module, datamodule, batch_arg_name)
    records = trials if trials is not None else []
    samples = _dataset_size(trainer)
    largest = max_val if samples is None else min(max_val, samples)

    with tuning_session(trainer) as session:

        def trial(batch_size: int) -> None:
            # Every trial starts from the same state; what the last one left behind is released here.
            session.restore()
            set_attribute(module, datamodule, batch_arg_name, batch_size)
            reload_train_data(trainer)
            loop = prepare_steps(trainer, steps_per_trial)
            if limit is None:
                try:
                    train_steps(trainer, loop)
                except Exception:
                    records.append(BatchSizeTrial(batch_size, False))
                    raise
                records.append(BatchSizeTrial(batch_size, True))
                return
            held = resident_bytes(_training_tensors(trainer))
            footprint = measure_cpu_footprint(lambda: train_steps(trainer, loop), held)
            fits = footprint.total <= limit
            records.append(BatchSizeTrial(batch_size, fits, footprint))
            if not fits:
                raise MemoryLimitExceeded(batch_size, footprint, limit)

        try:
            found = search_batch_size(
                trial, init_val=init_val, mode=mode, max_trials=max_trials, max_val=largest
            )
        except RuntimeError as error:
            set_attribute(module, datamodule, batch_arg_name, original)
            if "No executable batch size" not in str(error):
                raise
            where = f"max_memory={max_memory!r}" if limit is not None else "the device's memory"
            raise RuntimeError(f"Batch-size scaling: not even a batch of 1 fits in {where}.") from error
    if mode == "binsearch" and margin > 0:
        found = max(
            1, int(found * (1 - margin))
        )  # Lightning's safety margin below the largest size that fitted
    set_attribute(module, datamodule, batch_arg_name, found)
    reload_train_data(trainer)
    get_logger(__name__).info(
        f"Batch size {found} fits ({len(records)} trials); {batch_arg_name} set to {found}."
    )
    return found


def _dataset_size(trainer: Trainer) -> int | None:
    """The number of training samples, when the loader knows it (no batch is larger)."""
    loader = trainer.train_dataloader
    dataset = getattr(loader, "dataset", None)
    try:
        return len(dataset) if dataset is not None else None
    except TypeError:
        return None


def _training_tensors(trainer: Trainer) -> list[Any]:
    """What a training step keeps in memory before it starts: weights, buffers and optimizer state."""
    tensors: list[Any] = list(trainer.run_state.module.state_dict(keep_vars=True).values())
    for optimizer in trainer.optimizers:
        for state in optimizer.state.values():
            tensors.extend(state.values())
    return tensors
