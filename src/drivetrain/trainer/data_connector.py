"""Which loaders each stage uses, prepared by the data layer for this process.

Loaders come from the ``fit``/``validate``/… arguments, a :class:`DataModule`, or the module's
own ``*_dataloader`` methods. They are resolved, prepared and measured (under the
``limit_*_batches`` settings) once per entry point, inside each process, through
:func:`drivetrain.data.prepare_data_loader` — the same sharding at the batch-sampler level as the
Accelerator's: training loaders give every process an equal share (the last round is evened out
with repeats, so the processes step together); evaluation and prediction loaders deal whole
batches without repeats, so no sample counts twice and the prediction loop puts the results back
in dataset order. ``Trainer(use_distributed_sampler=False)`` leaves the sharding to the user, and
so does a ``DistributedSampler`` in the loader. Shuffling depends only on ``(seed, epoch)``.
Anything else (a list of batches, a ``DataLoader`` subclass with its own iteration) is passed
through unsharded (:class:`drivetrain.data.PassThroughBatches`).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from torch.utils.data import BatchSampler, DataLoader, Dataset, IterableDataset, RandomSampler

from drivetrain._utilities.snapshots import Restorable
from drivetrain.data import PassThroughBatches, PreparedDataLoader, can_prepare, prepare_data_loader
from drivetrain.data.loader import loader_settings
from drivetrain.trainer.datamodule import DataModule
from drivetrain.trainer.hooks import overrides
from drivetrain.trainer.loop_hooks import TRANSFER_HOOKS
from drivetrain.trainer.module import TrainingModule
from drivetrain.trainer.state import RunningStage, TrainerFn

if TYPE_CHECKING:
    from drivetrain.trainer.run_state import RunState
    from drivetrain.trainer.trainer import Trainer

_STEP_FOR = {
    RunningStage.VALIDATING: "validation_step",
    RunningStage.SANITY_CHECKING: "validation_step",
    RunningStage.TESTING: "test_step",
    RunningStage.PREDICTING: "predict_step",
}
_LIMIT_FOR = {
    RunningStage.TRAINING: "limit_train_batches",
    RunningStage.VALIDATING: "limit_val_batches",
    RunningStage.SANITY_CHECKING: "limit_val_batches",
    RunningStage.TESTING: "limit_test_batches",
    RunningStage.PREDICTING: "limit_predict_batches",
}


class DataConnector(Restorable):
    """The loaders of the current entry point, as this process sees them."""

    def __init__(self, trainer: Trainer, run: RunState) -> None:
        self.trainer = trainer
        self.run_state = run
        self.datamodule: DataModule | None = None
        #: The loaders the entry point was given by name (``"train"``, ``"val"`` …).
        self.given: dict[str, Any] = {}
        self.train_loader: Any = None
        self.num_training_batches: float = 0.0
        self.validation_enabled = False
        self._eval: dict[RunningStage, tuple[list[Any], list[float]]] = {}
        self._loaded_in: dict[RunningStage, int] = {}  # the epoch each fit loader was last loaded in

    def attach(self, datamodule: DataModule | None, **loaders: Any) -> None:
        """Remember what the entry point was given (called in the launching process)."""
        if datamodule is not None and not isinstance(datamodule, DataModule):
            raise TypeError(f"datamodule= expects a drivetrain.DataModule, got {type(datamodule).__name__}.")
        given = {k: v for k, v in loaders.items() if v is not None}
        if datamodule is not None and given:
            raise ValueError(
                f"Pass either datamodule= or dataloaders ({', '.join(sorted(given))}), not both: the DataModule "
                f"already provides the loaders."
            )
        self.datamodule = datamodule
        self.given = given

    def prepare_data(self, stage: str) -> None:
        """``prepare_data`` of the DataModule and the module once per node, then the DataModule's ``setup``."""

        trainer, datamodule = self.trainer, self.datamodule
        module = self.run_state.module
        module_prepares = overrides(module, TrainingModule, "prepare_data")
        if datamodule is None and not module_prepares:
            return
        if trainer.strategy.local_rank == 0:
            if datamodule is not None:
                datamodule.prepare_data()
            if module_prepares:
                module.prepare_data()
        trainer.strategy.barrier("prepare_data")
        if datamodule is not None:
            datamodule.setup(stage)

    # -- resolving -----------------------------------------------------------------------------
    def _source(self, prefix: str) -> Any:
        """The loader(s) for ``prefix`` ("train", "val", "test", "predict"), or None."""
        if prefix in self.given:
            return self.given[prefix]
        method = f"{prefix}_dataloader"
        datamodule = self.datamodule
        if datamodule is not None:
            return getattr(datamodule, method)() if overrides(datamodule, DataModule, method) else None
        module_method = getattr(self.run_state.module, method, None)
        return module_method() if callable(module_method) else None

    def setup(self, fn: TrainerFn) -> None:
        """Resolve, shard and measure the loaders ``fn`` needs (called in every process)."""
        self._eval = {}
        if fn == TrainerFn.FITTING:
            self._loaded_in = {RunningStage.TRAINING: 0, RunningStage.VALIDATING: 0}
            self._setup_training()
            self.validation_enabled = self._prepare_eval(RunningStage.VALIDATING, required=False)
        else:
            stage = {
                TrainerFn.VALIDATING: RunningStage.VALIDATING,
                TrainerFn.TESTING: RunningStage.TESTING,
                TrainerFn.PREDICTING: RunningStage.PREDICTING,
            }[fn]
            self._prepare_eval(stage, required=True)

    def _setup_training(self) -> None:
        loader = self._source("train")
        if loader is None:
            raise ValueError(
                "fit() has no training data: pass train_dataloaders=..., a datamodule with train_dataloader(), "
                "or define train_dataloader() on the module."
            )
        if is_loader_list(loader):
            raise TypeError(
                f"fit() got {len(loader)} training loaders; it trains on one. Combine the datasets "
                f"(torch.utils.data.ConcatDataset) into one loader."
            )
        self.train_loader = self._prepare(loader, RunningStage.TRAINING)
        limit = self.run_state.settings.limit_train_batches
        self.num_training_batches = limited_length(self.train_loader, limit, "limit_train_batches")
        if self.num_training_batches == 0:
            raise ValueError(_no_training_batches(self.train_loader, limit))

    def reload_if_due(self, stage: RunningStage, epoch: int) -> bool:
        """Call the ``train_dataloader``/``val_dataloader`` hook again when ``reload_dataloaders_every_n_epochs``
        epochs have passed since it was last called; whether it was."""
        every = self.run_state.features.reload_dataloaders_every_n_epochs
        if not every or epoch - self._loaded_in[stage] < every:
            return False
        self._loaded_in[stage] = epoch
        if stage == RunningStage.TRAINING:
            self._setup_training()
        else:
            self.validation_enabled = self._prepare_eval(RunningStage.VALIDATING, required=False)
        return True

    def _prepare_eval(self, stage: RunningStage, required: bool) -> bool:
        trainer, run = self.trainer, self.run_state
        prefix = stage.dataloader_prefix
        step = _STEP_FOR[stage]
        source = self._source(prefix)
        module = run.module

        has_step = stage == RunningStage.PREDICTING or overrides(module, TrainingModule, step)
        if required:
            if not has_step:
                raise ValueError(
                    f"{type(module).__name__} does not define {step}(self, batch, batch_idx), which "
                    f"Trainer.{trainer.state.fn.value if trainer.state.fn else stage.value}() runs."
                )
            if source is None:
                raise ValueError(
                    f"Trainer.{trainer.state.fn.value if trainer.state.fn else stage.value}() has no data: pass "
                    f"dataloaders=..., a datamodule with {prefix}_dataloader(), or define {prefix}_dataloader() on "
                    f"the module."
                )
        elif source is None or not has_step:
            if source is not None:
                warnings.warn(
                    f"Validation data was given but {type(module).__name__} has no validation_step; validation is "
                    f"skipped. Define validation_step, or drop the validation loader.",
                    UserWarning,
                    stacklevel=4,
                )
            return False
        limit = getattr(run.settings, _LIMIT_FOR[stage])
        loaders = [self._prepare(loader, stage, index) for index, loader in enumerate(as_loader_list(source))]
        lengths = [limited_length(loader, limit, _LIMIT_FOR[stage]) for loader in loaders]
        self._eval[stage] = (loaders, lengths)
        return any(length > 0 for length in lengths)

    def _prepare(self, loader: Any, stage: RunningStage, dataloader_idx: int = 0) -> Any:
        trainer, features = self.trainer, self.run_state.features
        strategy = trainer.strategy
        if isinstance(loader, Dataset) and not isinstance(loader, IterableDataset):
            # Iterable through __getitem__, it would be read one unbatched sample at a time.
            raise TypeError(
                f"The {stage.dataloader_prefix} dataloader is a {type(loader).__name__}, a Dataset rather than a "
                f"DataLoader: the Trainer would read it one sample at a time, without batching. Wrap it: "
                f"DataLoader(dataset, batch_size=32{', shuffle=True' if stage == RunningStage.TRAINING else ''})."
            )
        mover = batch_transfer(self.run_state.module, strategy, dataloader_idx)
        if features.overfit_batches and trainer.state.fn == TrainerFn.FITTING:
            loader = in_order(loader, stage)
        if can_prepare(loader):
            prepared: Any = prepare_data_loader(
                loader,
                strategy,
                even_batches=stage == RunningStage.TRAINING,
                dispatch_batches=False,
                # An iterable dataset is a stream only the user knows how to split.
                shard=features.use_distributed_sampler and not isinstance(loader.dataset, IterableDataset),
                batch_mover=mover,
                # The global generator then advances as under Lightning, which iterates the plain loader:
                # after seed_everything a step's torch.rand (dropout) is Lightning's.
                draw_global_seeds=True,
            )
        else:
            sharded = features.use_distributed_sampler and strategy.world_size > 1
            if sharded and isinstance(loader, DataLoader) and not isinstance(loader.dataset, IterableDataset):
                raise TypeError(
                    f"The {stage.dataloader_prefix} dataloader is a {type(loader).__name__}, a DataLoader subclass "
                    f"with its own iteration, which the Trainer cannot share between {strategy.world_size} "
                    f"processes without losing it. Make it yield this process's share (rank "
                    f"{strategy.global_rank} of {strategy.world_size}) and pass Trainer(use_distributed_sampler=False)."
                )
            prepared = PassThroughBatches(loader, mover or strategy.batch_mover())
        processed = strategy.process_dataloader(prepared)
        if processed is not prepared and not isinstance(processed, (PreparedDataLoader, PassThroughBatches)):
            # A strategy wrapped the loader: keep the interface the loops use (epochs, position).
            processed = PassThroughBatches(processed, None)
        return processed

    def eval_loaders(self, stage: RunningStage) -> tuple[list[Any], list[float]]:
        """The loaders of ``stage`` and how many batches of each to use."""
        if stage == RunningStage.SANITY_CHECKING:
            loaders, lengths = self._eval.get(RunningStage.VALIDATING, ([], []))
            steps = self.run_state.settings.num_sanity_val_steps
            return loaders, [length if steps == -1 else min(length, steps) for length in lengths]
        return self._eval.get(stage, ([], []))


def batch_transfer(module: Any, strategy: Any, dataloader_idx: int) -> Callable[[Any], Any] | None:
    """The module's batch-transfer hooks around the move to the device, for one loader; ``None`` when
    the module overrides none of them (the strategy's mover then runs alone: nothing per batch on the CPU).

    Lightning's order: ``on_before_batch_transfer`` → ``transfer_batch_to_device`` (default: the
    strategy's move) → ``on_after_batch_transfer``, before ``on_*_batch_start``.
    """

    hooks = [
        getattr(module, name) if overrides(module, TrainingModule, name) else None for name in TRANSFER_HOOKS
    ]
    if not any(hooks):
        return None
    before, transfer, after = hooks
    device = strategy.root_device
    move = strategy.batch_mover()

    def place(batch: Any) -> Any:
        if before is not None:
            batch = before(batch, dataloader_idx)
        if transfer is not None:
            batch = transfer(batch, device, dataloader_idx)
        elif move is not None:
            batch = move(batch)
        if after is not None:
            batch = after(batch, dataloader_idx)
        return batch

    return place


def _no_training_batches(loader: Any, limit: int | float) -> str:
    """Why fit() would train on nothing (it would loop over empty epochs forever), and the fix."""
    if limit == 0:
        return (
            f"limit_train_batches={limit} leaves fit() no batch to train on. Use a positive number of batches or "
            f"fraction, or call trainer.validate() to run validation without training."
        )
    if loader_length(loader) == 0:
        return (
            "The training loader is empty (len(loader) == 0 in this process), so fit() has nothing to train on. "
            "Check the dataset, and that batch_size is not larger than the data with drop_last=True."
        )
    return (
        f"limit_train_batches={limit} is a fraction of {int(loader_length(loader))} batches that rounds down to 0. "
        f"Use a larger fraction or a number of batches."
    )


def is_loader_list(value: Any) -> bool:
    """Whether ``value`` is several loaders (rather than one iterable of batches)."""
    return isinstance(value, (list, tuple)) and bool(value) and all(isinstance(v, DataLoader) for v in value)


def as_loader_list(value: Any) -> list[Any]:
    if value is None:
        return []
    return list(value) if is_loader_list(value) else [value]


def loader_length(loader: Any) -> float:
    """``len(loader)``, or infinity for loaders without a length."""
    try:
        return float(len(loader))
    except TypeError:
        return math.inf


def limited_length(loader: Any, limit: int | float, name: str) -> float:
    """How many batches of ``loader`` a stage uses under ``limit`` (a count or a fraction)."""
    length = loader_length(loader)
    if isinstance(limit, int):
        return float(min(limit, length))
    if limit == 1.0:
        return length
    if math.isinf(length):
        raise ValueError(
            f"{name}={limit} is a fraction, but the loader has no length (an iterable dataset). Pass a number of "
            f"batches instead ({name}=100), or 1.0 for all of it."
        )
    return float(int(length * limit))


def check_limit(name: str, value: Any) -> int | float:
    """Validate a ``limit_*_batches`` value: an int >= 0 or a float in [0, 1]."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(
            f"{name} expects an int (batches) or a float (fraction of the loader), got {value!r}."
        )
    if isinstance(value, float) and not 0.0 <= value <= 1.0:
        raise ValueError(
            f"{name}={value} is a fraction outside [0, 1]; use a float in [0, 1] or an int number of batches."
        )
    if isinstance(value, int) and value < 0:
        raise ValueError(f"{name}={value} is negative; use 0 (skip this stage) or more batches.")
    return value


def in_order(loader: Any, stage: RunningStage) -> Any:
    """``loader`` without shuffling, for ``overfit_batches`` (the same batches every epoch), with Lightning's warning."""
    if not isinstance(loader, DataLoader) or type(loader.sampler) is not RandomSampler:
        return loader
    if loader.batch_sampler is not None and type(loader.batch_sampler) is not BatchSampler:
        return loader  # a custom batch sampler decides the order itself
    warnings.warn(
        f"Trainer(overfit_batches=...) repeats the same {stage.dataloader_prefix} batches every epoch, but the "
        f"{stage.dataloader_prefix} dataloader shuffles; it is read in order instead (shuffle=False).",
        UserWarning,
        stacklevel=2,
    )
    return DataLoader(
        loader.dataset,
        batch_size=loader.batch_size,
        shuffle=False,
        drop_last=loader.drop_last,
        **loader_settings(loader),
    )
