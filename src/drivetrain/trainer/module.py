"""``TrainingModule``: an ``nn.Module`` that also says how to train, evaluate and predict with it.

Subclasses define ``training_step`` and ``configure_optimizers`` (and, as needed,
``validation_step``, ``test_step``, ``predict_step`` and hooks). Every hook here is a no-op; the
Trainer calls only the hooks a subclass overrides.
"""

from __future__ import annotations

import inspect
import itertools
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import torch
from torch import Tensor
from torch.optim import Optimizer

from drivetrain._utilities import console
from drivetrain.trainer.hparams import AttributeDict, collect_hyperparameters, load_module_from_checkpoint
from drivetrain.trainer.loop_hooks import LoopHooks
from drivetrain.trainer.module_tools import ModuleTools
from drivetrain.trainer.properties import TrainerProperties

if TYPE_CHECKING:
    from drivetrain.loggers.logger import Logger
    from drivetrain.trainer.trainer import Trainer

M = TypeVar("M", bound="TrainingModule")


class TrainingModule(LoopHooks, ModuleTools):
    """A model plus its training recipe, for :class:`~drivetrain.Trainer`.

    Example:
        >>> class Classifier(TrainingModule):
        ...     def __init__(self, lr: float = 1e-3) -> None:
        ...         super().__init__()
        ...         self.save_hyperparameters()
        ...         self.net = nn.Linear(64, 10)
        ...
        ...     def training_step(self, batch, batch_idx):
        ...         x, y = batch
        ...         loss = nn.functional.cross_entropy(self.net(x), y)
        ...         self.log("train_loss", loss, prog_bar=True)
        ...         return loss
        ...
        ...     def configure_optimizers(self):
        ...         return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)
    """

    # Properties torch.jit.script must not compile (they reach the Trainer or hold Python objects).
    __jit_unused_properties__: list[str] = [
        "trainer",
        "device",
        "dtype",
        "global_step",
        "current_epoch",
        "global_rank",
        "local_rank",
        "logger",
        "loggers",
        "hparams",
        "example_input_array",
        "device_mesh",
    ]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: ``False`` to step optimizers yourself in ``training_step`` (``self.optimizers()``, ``self.manual_backward``).
        self.automatic_optimization: bool = True
        self._trainer: Trainer | None = None
        self._results: Any = None
        self._hparams: AttributeDict = AttributeDict()
        self._warned_unattached_log = False

    # -- what the Trainer provides -----------------------------------------------------------
    @property
    def trainer(self) -> Trainer:
        """The Trainer running this module; an error outside a Trainer run."""
        trainer = self.__dict__.get("_trainer")
        if trainer is None and not self.__dict__.get("_jit_is_scripting", False):
            raise RuntimeError(
                f"{type(self).__name__} is not attached to a Trainer: self.trainer exists only while "
                f"Trainer.fit/validate/test/predict runs it."
            )
        return trainer  # type: ignore[return-value]  # None only while to_torchscript inspects the class

    @trainer.setter
    def trainer(self, trainer: Trainer | None) -> None:
        """Attach a Trainer (or detach with ``None``), as Lightning allows; nested modules follow.

        The Trainer attaches itself when an entry point starts; setting it by hand serves code that
        calls a module's hooks outside a run (tests, a module built inside another's hook).
        """
        if trainer is not None and not isinstance(trainer, TrainerProperties):
            raise TypeError(
                f"{type(self).__name__}.trainer = {type(trainer).__name__}: assign a drivetrain.Trainer, or None "
                f"to detach the module."
            )
        for child in self.modules():
            if isinstance(child, TrainingModule):
                child.__dict__["_trainer"] = trainer

    @property
    def device(self) -> torch.device:
        """The device this module computes on."""
        trainer = self.__dict__.get("_trainer")
        if trainer is not None and trainer.run_state.strategy_ready:
            return trainer.strategy.root_device
        for parameter in self.parameters():
            return parameter.device
        for buffer in self.buffers():
            return buffer.device
        return torch.device("cpu")

    @property
    def dtype(self) -> torch.dtype:
        """The dtype of the module's floating-point weights (``torch.get_default_dtype()`` without any), as
        Lightning's ``LightningModule.dtype``: ``torch.bfloat16`` under ``precision="bf16-true"``, say."""
        for tensor in itertools.chain(self.parameters(), self.buffers()):
            if tensor.is_floating_point():
                return tensor.dtype
        return torch.get_default_dtype()

    @dtype.setter
    def dtype(self, value: Any) -> None:
        raise RuntimeError(
            f"{type(self).__name__}.dtype follows the weights and cannot be set; convert them with "
            f"module.to({value!r}), or choose the Trainer's precision (e.g. precision='bf16-true')."
        )

    @property
    def device_mesh(self) -> Any:
        """The strategy's torch ``DeviceMesh`` (``None`` for strategies without one).

        Under ``strategy="model_parallel"`` it has named dimensions: apply tensor parallelism in
        :meth:`configure_model` with ``parallelize_module(layer, self.device_mesh["tensor_parallel"], plan)``.
        """
        trainer = self.__dict__.get("_trainer")
        if trainer is None:
            return None
        return getattr(trainer.strategy, "device_mesh", None)

    @property
    def global_step(self) -> int:
        trainer = self.__dict__.get("_trainer")
        return trainer.global_step if trainer is not None else 0

    @property
    def current_epoch(self) -> int:
        trainer = self.__dict__.get("_trainer")
        return trainer.current_epoch if trainer is not None else 0

    @property
    def global_rank(self) -> int:
        trainer = self.__dict__.get("_trainer")
        return trainer.global_rank if trainer is not None else 0

    @property
    def local_rank(self) -> int:
        trainer = self.__dict__.get("_trainer")
        return trainer.local_rank if trainer is not None else 0

    @property
    def logger(self) -> Logger | None:
        trainer = self.__dict__.get("_trainer")
        return trainer.logger if trainer is not None else None

    @property
    def loggers(self) -> list[Logger]:
        trainer = self.__dict__.get("_trainer")
        return trainer.loggers if trainer is not None else []

    # -- the recipe ----------------------------------------------------------------------------
    def training_step(self, *args: Any, **kwargs: Any) -> Any:
        """One training step: return the loss (a tensor), a dict with ``"loss"``, or ``None`` to skip."""
        raise NotImplementedError(f"{type(self).__name__} must define training_step(self, batch, batch_idx).")

    def validation_step(self, *args: Any, **kwargs: Any) -> Any:
        """One validation step; log metrics with :meth:`log`."""

    def test_step(self, *args: Any, **kwargs: Any) -> Any:
        """One test step; log metrics with :meth:`log`."""

    def predict_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> Any:
        """One prediction step; by default ``self(batch)``."""
        return self(batch)

    def configure_optimizers(self) -> Any:
        """The optimizer(s) and learning-rate scheduler(s).

        Return an optimizer; a list of optimizers; ``([optimizers], [schedulers])``; a dict
        ``{"optimizer": opt, "lr_scheduler": scheduler or {"scheduler": s, "interval": "step" |
        "epoch", "frequency": n, "monitor": "val_loss"}}``; or a list of such dicts.
        """
        raise NotImplementedError(f"{type(self).__name__} must define configure_optimizers(self).")

    def configure_model(self) -> None:
        """Build layers whose creation should wait for the strategy (sharded, meta-device or large models).

        Runs inside the strategy's initialisation context (right device and dtype, sharded
        where the strategy shards). Keep it idempotent: it may run on a module that already has
        the layers.
        """

    # -- hooks (the Trainer calls only those a subclass overrides; more in LoopHooks) ---------
    def setup(self, stage: str) -> None:
        """Called at the start of fit/validate/test/predict in every process (``stage`` names it)."""

    def teardown(self, stage: str) -> None:
        """Called at the end of fit/validate/test/predict in every process."""

    def on_fit_start(self) -> None: ...
    def on_fit_end(self) -> None: ...
    def on_train_start(self) -> None: ...
    def on_train_end(self) -> None: ...
    def on_train_epoch_start(self) -> None: ...
    def on_train_epoch_end(self) -> None: ...

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> Any:
        """Before a training batch; return ``-1`` to end the epoch here."""

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None: ...
    def on_validation_start(self) -> None: ...
    def on_validation_end(self) -> None: ...
    def on_validation_epoch_start(self) -> None: ...
    def on_validation_epoch_end(self) -> None: ...
    def on_validation_batch_start(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None: ...
    def on_validation_batch_end(
        self, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None: ...
    def on_test_start(self) -> None: ...
    def on_test_end(self) -> None: ...
    def on_test_epoch_start(self) -> None: ...
    def on_test_epoch_end(self) -> None: ...
    def on_test_batch_start(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None: ...
    def on_test_batch_end(
        self, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None: ...
    def on_predict_start(self) -> None: ...
    def on_predict_end(self) -> None: ...
    def on_predict_epoch_start(self) -> None: ...
    def on_predict_epoch_end(self) -> None: ...
    def on_predict_batch_start(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None: ...
    def on_predict_batch_end(
        self, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None: ...
    def on_before_backward(self, loss: Tensor) -> None: ...
    def on_after_backward(self) -> None: ...
    def on_before_optimizer_step(self, optimizer: Optimizer) -> None: ...
    def on_before_zero_grad(self, optimizer: Optimizer) -> None: ...

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Add entries to ``checkpoint`` before it is written (plain values, tensors, dicts)."""

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Read what :meth:`on_save_checkpoint` added, when a checkpoint is loaded."""

    # -- logging -------------------------------------------------------------------------------
    def log(
        self,
        name: str,
        value: Tensor | float,
        prog_bar: bool = False,
        logger: bool = True,
        on_step: bool | None = None,
        on_epoch: bool | None = None,
        reduce_fx: Any = "mean",
        sync_dist: bool | None = None,
        batch_size: int | None = None,
        rank_zero_only: bool = False,
    ) -> None:
        """Record a metric: for the loggers, the progress bar and ``trainer.callback_metrics``.

        Args:
            name: the metric's name.
            value: a number or a one-element tensor (kept on its device; no sync here).
            prog_bar: show it in the progress bar.
            logger: send it to the loggers.
            on_step: record each step's value (default: in training batch hooks only).
            on_epoch: record the epoch's reduction (default: everywhere except training batch hooks).
            reduce_fx: how a step's values make the epoch value: ``"mean"`` (weighted by batch
                size), ``"sum"``, ``"max"``, ``"min"``.
            sync_dist: ``True`` reduces each step value across processes when it is logged (a
                collective per call); epoch values are reduced across processes unless ``False``.
            batch_size: the weight of this value in an epoch mean (default: inferred from the batch).
            rank_zero_only: log from global rank 0 only (the value is not reduced across processes).
        """
        results = self._results
        if results is None:
            self._warn_unattached()
            return
        slot = results.fast.get(name)
        if (
            slot is not None
            and type(value) is Tensor
            and not rank_zero_only
            and slot.options == (prog_bar, logger, on_step, on_epoch, reduce_fx, sync_dist, True)
        ):
            # The per-step hot path: a metric already seen with these settings (ResultCollection.log).
            slot.last = value
            slot.mark = results.mark
            return
        if rank_zero_only:
            if self._trainer is not None and not self._trainer.is_global_zero:
                return
            sync_dist = False
        results.log(name, value, prog_bar, logger, on_step, on_epoch, reduce_fx, sync_dist, batch_size)

    def log_dict(
        self,
        dictionary: Mapping[str, Tensor | float],
        prog_bar: bool = False,
        logger: bool = True,
        on_step: bool | None = None,
        on_epoch: bool | None = None,
        reduce_fx: Any = "mean",
        sync_dist: bool | None = None,
        batch_size: int | None = None,
        rank_zero_only: bool = False,
    ) -> None:
        """:meth:`log` each entry of ``dictionary`` with the same settings."""
        for name, value in dictionary.items():
            self.log(
                name,
                value,
                prog_bar,
                logger,
                on_step,
                on_epoch,
                reduce_fx,
                sync_dist,
                batch_size,
                rank_zero_only,
            )

    def _warn_unattached(self) -> None:
        if not self.__dict__.get("_warned_unattached_log"):
            self.__dict__["_warned_unattached_log"] = True
            warnings.warn(
                f"{type(self).__name__}.log() was called outside a Trainer run; the value is not recorded. "
                f"Logging works inside Trainer.fit/validate/test/predict.",
                UserWarning,
                stacklevel=3,
            )

    def print(self, *args: Any, **kwargs: Any) -> None:
        """``print`` (same arguments) from global rank 0 only, written above the progress bar, not through it."""
        trainer = self.__dict__.get("_trainer")
        if trainer is None or trainer.is_global_zero:
            console.print_line(*args, **kwargs)

    # -- optimisation helpers --------------------------------------------------------------------
    def optimizers(self) -> Any:
        """The optimizer (or list of them) ``configure_optimizers`` returned, for manual optimisation.

        Their ``step()`` goes through the strategy (precision, loss scaling) and counts as a
        global step.
        """
        trainer = self.trainer
        optimizers = trainer.run_state.manual_optimizers or trainer.optimizers
        if not optimizers:
            raise RuntimeError(
                f"{type(self).__name__}.optimizers() has nothing to return yet: the optimizers are made from "
                f"configure_optimizers() when Trainer.fit sets the module up."
            )
        return optimizers[0] if len(optimizers) == 1 else list(optimizers)

    def lr_schedulers(self) -> Any:
        """The scheduler (or list of them), or ``None`` when there are none."""
        schedulers = [config.scheduler for config in self.trainer.lr_scheduler_configs]
        if not schedulers:
            return None
        return schedulers[0] if len(schedulers) == 1 else schedulers

    def manual_backward(self, loss: Tensor, *args: Any, **kwargs: Any) -> None:
        """``loss.backward()`` through the strategy (loss scaling, DDP), for manual optimisation."""
        self.trainer.run_state.optimization.manual_backward(loss, *args, **kwargs)

    def clip_gradients(
        self,
        optimizer: Optimizer,
        gradient_clip_val: float | None = None,
        gradient_clip_algorithm: str = "norm",
    ) -> Tensor | None:
        """Clip the gradients of ``optimizer``'s parameters by total norm or by value."""
        return self.trainer.run_state.optimization.clip(optimizer, gradient_clip_val, gradient_clip_algorithm)

    def all_gather(self, data: Tensor, sync_grads: bool = False) -> Tensor:
        """Stack ``data`` from every process along a new first dimension."""
        return self.trainer.strategy.all_gather(data, sync_grads=sync_grads)

    # -- hyperparameters -------------------------------------------------------------------------
    @property
    def hparams(self) -> AttributeDict:
        """What :meth:`save_hyperparameters` saved; also written to checkpoints and loggers."""
        return self.__dict__.setdefault("_hparams", AttributeDict())

    def save_hyperparameters(self, *args: Any, ignore: str | Sequence[str] | None = None) -> None:
        """Save ``__init__``'s arguments (all, the named ones, or one dict/namespace) as :attr:`hparams`.

        Call it from ``__init__``. Saved values go into checkpoints, so that
        :meth:`load_from_checkpoint` can rebuild the module, and to the loggers.
        """
        frame = inspect.currentframe()
        caller = frame.f_back if frame is not None else None
        try:
            self.hparams.update(collect_hyperparameters(args, caller, ignore))
        finally:
            del frame, caller

    @classmethod
    def load_from_checkpoint(
        cls: type[M],
        checkpoint_path: str | Path,
        map_location: Any = None,
        strict: bool | None = None,
        weights_only: bool | None = None,
        **kwargs: Any,
    ) -> M:
        """Build the module from a Trainer checkpoint: saved hyperparameters (``kwargs`` override them), then weights.

        The file is read safely (``weights_only`` ``None``/``True``); ``weights_only=False``
        unpickles anything, which can run code from it: only for checkpoints you trust.
        ``strict=None`` follows the module's :attr:`strict_loading` (default ``True``).
        """
        return load_module_from_checkpoint(cls, checkpoint_path, map_location, strict, kwargs, weights_only)

    # -- pickling (spawned processes, deepcopy) ---------------------------------------------------
    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_trainer"] = None  # the Trainer re-attaches itself; copying it along would copy the run
        state["_results"] = None
        return state
