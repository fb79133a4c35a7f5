"""Which loaders each stage uses: from the entry point's arguments, a DataModule, or the module.

The loaders are resolved, sharded for this rank and measured (under the ``limit_*_batches``
settings) once per entry point, inside each process.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any

import torch

from drivetrain.trainer.data import as_loader_list, is_loader_list, limited_length, loader_length, shard
from drivetrain.trainer.datamodule import DataModule
from drivetrain.trainer.hooks import overrides
from drivetrain.trainer.state import RunningStage, TrainerFn

if TYPE_CHECKING:
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


class DataConnector:
    """The loaders of the current entry point, as this process sees them."""

    def __init__(self, trainer: Trainer) -> None:
        self.trainer = trainer
        self.datamodule: DataModule | None = None
        self._given: dict[str, Any] = {}
        self.train_loader: Any = None
        self.num_training_batches: float = 0.0
        self.validation_enabled = False
        self._eval: dict[RunningStage, tuple[list[Any], list[float]]] = {}

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
        self._given = given

    # -- resolving -----------------------------------------------------------------------------
    def _source(self, prefix: str) -> Any:
        """The loader(s) for ``prefix`` ("train", "val", "test", "predict"), or None."""
        if prefix in self._given:
            return self._given[prefix]
        method = f"{prefix}_dataloader"
        datamodule = self.datamodule
        if datamodule is not None:
            return getattr(datamodule, method)() if overrides(datamodule, DataModule, method) else None
        module_method = getattr(self.trainer._module, method, None)
        return module_method() if callable(module_method) else None

    def setup(self, fn: TrainerFn) -> None:
        """Resolve, shard and measure the loaders ``fn`` needs (called in every process)."""
        self._eval = {}
        trainer = self.trainer
        if fn == TrainerFn.FITTING:
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
            limit = trainer._settings.limit_train_batches
            self.num_training_batches = limited_length(self.train_loader, limit, "limit_train_batches")
            if self.num_training_batches == 0:
                raise ValueError(_no_training_batches(self.train_loader, limit))
            self.validation_enabled = self._prepare_eval(RunningStage.VALIDATING, required=False)
        else:
            stage = {
                TrainerFn.VALIDATING: RunningStage.VALIDATING,
                TrainerFn.TESTING: RunningStage.TESTING,
                TrainerFn.PREDICTING: RunningStage.PREDICTING,
            }[fn]
            self._prepare_eval(stage, required=True)

    def _prepare_eval(self, stage: RunningStage, required: bool) -> bool:
        trainer = self.trainer
        prefix = stage.dataloader_prefix
        step = _STEP_FOR[stage]
        source = self._source(prefix)
        module = trainer._module
        from drivetrain.trainer.module import TrainingModule

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
        limit = getattr(trainer._settings, _LIMIT_FOR[stage])
        loaders = [self._prepare(loader, stage) for loader in as_loader_list(source)]
        lengths = [limited_length(loader, limit, _LIMIT_FOR[stage]) for loader in loaders]
        self._eval[stage] = (loaders, lengths)
        return any(length > 0 for length in lengths)

    def _prepare(self, loader: Any, stage: RunningStage) -> Any:
        trainer = self.trainer
        strategy = trainer.strategy
        sampler_kwargs = strategy.distributed_sampler_kwargs
        if trainer._use_distributed_sampler and sampler_kwargs is not None and strategy.world_size > 1:
            loader = shard(loader, stage, sampler_kwargs, self._shuffle_seed())
        return strategy.process_dataloader(loader)

    def _shuffle_seed(self) -> int:
        # Every rank must shuffle with the same seed, or the shares overlap: take rank 0's.
        if not hasattr(self, "_seed"):
            self._seed = int(self.trainer.strategy.broadcast(torch.initial_seed() % (2**31)))
        return self._seed

    def eval_loaders(self, stage: RunningStage) -> tuple[list[Any], list[float]]:
        """The loaders of ``stage`` and how many batches of each to use."""
        if stage == RunningStage.SANITY_CHECKING:
            loaders, lengths = self._eval.get(RunningStage.VALIDATING, ([], []))
            steps = self.trainer._settings.num_sanity_val_steps
            return loaders, [length if steps == -1 else min(length, steps) for length in lengths]
        return self._eval.get(stage, ([], []))


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
