"""``StochasticWeightAveraging``: average the weights of the last epochs, under an SWA learning rate.

From the epoch ``swa_epoch_start`` names to the last one, the learning rate anneals to ``swa_lrs``
(:class:`torch.optim.swa_utils.SWALR`, stepped once per epoch; the module's own schedulers pause)
and the weights at the end of every such epoch go into an
:class:`~torch.optim.swa_utils.AveragedModel`. When the fit ends the model gets the averaged
weights and, if it has BatchNorm layers, statistics recomputed for them with one pass over this
process's training data (:func:`torch.optim.swa_utils.update_bn`; averaged over the processes,
so every process ends with the same model). The average, the annealing position and the paused
schedulers are kept in checkpoints: a resumed fit ends with the same weights.

One deliberate difference from Lightning: the average takes the weights at the *end* of each SWA
epoch (the last one included), as in PyTorch's SWA recipe; Lightning takes them at the start of each.
"""

from __future__ import annotations

import itertools
import math
import warnings
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn
from torch.nn.modules.batchnorm import _BatchNorm

from drivetrain._utilities.log import get_logger
from drivetrain.trainer.callbacks.callback import Callback
from drivetrain.trainer.callbacks.weight_averaging import check_device, refuse_sharded

if TYPE_CHECKING:
    from torch.optim.swa_utils import SWALR, AveragedModel

    from drivetrain.trainer.module import TrainingModule
    from drivetrain.trainer.trainer import Trainer

_log = get_logger(__name__)
_STRATEGIES = ("cos", "linear")


class PausedScheduler:
    """A scheduler that does not step (SWA's schedule replaces it); saves and restores as the one it holds."""

    def __init__(self, scheduler: Any) -> None:
        self.scheduler = scheduler
        self.optimizer = scheduler.optimizer

    def step(self, *args: Any, **kwargs: Any) -> None:
        """Nothing: the SWA learning rate is in charge."""

    def state_dict(self) -> dict[str, Any]:
        return self.scheduler.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.scheduler.load_state_dict(state_dict)

    def get_last_lr(self) -> list[float]:
        return [group["lr"] for group in self.optimizer.param_groups]


class StochasticWeightAveraging(Callback):
    """Stochastic Weight Averaging (Izmailov et al., 2018) of the last epochs of a fit.

    Args:
        swa_lrs: the SWA learning rate: one for every parameter group, or a list with one per group.
        swa_epoch_start: the epoch SWA starts in: an int counts from 1 (``2`` is the second epoch), a
            float in ``(0, 1]`` is a fraction of ``max_epochs`` (``0.8``: the last 20 %).
        annealing_epochs: epochs over which the learning rate moves from its value to ``swa_lrs``.
        annealing_strategy: ``"cos"`` or ``"linear"`` annealing.
        avg_fn: the averaging rule ``avg_fn(averaged, current, num_averaged) -> new averaged`` (default:
            the mean of all snapshots).
        device: where the averaged copy lives (default the CPU; ``None``: the module's device).

    Example:
        >>> trainer = Trainer(max_epochs=20, callbacks=[StochasticWeightAveraging(swa_lrs=1e-2)])  # doctest: +SKIP
    """

    def __init__(
        self,
        swa_lrs: float | Sequence[float],
        swa_epoch_start: int | float = 0.8,
        annealing_epochs: int = 10,
        annealing_strategy: str = "cos",
        avg_fn: Callable[[Tensor, Tensor, Tensor | int], Tensor] | None = None,
        device: torch.device | str | int | None = torch.device("cpu"),  # noqa: B008 - Lightning's default
    ) -> None:
        name = type(self).__name__
        lrs: list[Any] = list(swa_lrs) if isinstance(swa_lrs, (list, tuple)) else [swa_lrs]
        if not lrs or not all(
            isinstance(lr, (int, float)) and not isinstance(lr, bool) and lr > 0 and math.isfinite(lr)
            for lr in lrs
        ):
            raise ValueError(
                f"{name}(swa_lrs={swa_lrs!r}): use a positive float, or a list of them (one per parameter group)."
            )
        if isinstance(swa_epoch_start, bool) or not isinstance(swa_epoch_start, (int, float)):
            raise TypeError(
                f"{name}(swa_epoch_start={swa_epoch_start!r}): use an int >= 1 or a float in (0, 1]."
            )
        if isinstance(swa_epoch_start, int) and swa_epoch_start < 1:
            raise ValueError(
                f"{name}(swa_epoch_start={swa_epoch_start}): an int counts epochs from 1; use >= 1."
            )
        if isinstance(swa_epoch_start, float) and not 0.0 < swa_epoch_start <= 1.0:
            raise ValueError(
                f"{name}(swa_epoch_start={swa_epoch_start}): a float is a fraction of max_epochs; use one in (0, 1]."
            )
        if (
            isinstance(annealing_epochs, bool)
            or not isinstance(annealing_epochs, int)
            or annealing_epochs < 0
        ):
            raise ValueError(f"{name}(annealing_epochs={annealing_epochs!r}): use an int >= 0.")
        if annealing_strategy not in _STRATEGIES:
            raise ValueError(f"{name}(annealing_strategy={annealing_strategy!r}): use 'cos' or 'linear'.")
        if avg_fn is not None and not callable(avg_fn):
            raise TypeError(
                f"{name}(avg_fn={avg_fn!r}): pass a function (averaged, current, num_averaged) or None."
            )
        self._swa_lrs = [float(lr) for lr in lrs]
        self._lrs_given_per_group = isinstance(swa_lrs, (list, tuple))
        self._swa_epoch_start = swa_epoch_start
        self._annealing_epochs = annealing_epochs
        self._annealing_strategy = annealing_strategy
        self._avg_fn = avg_fn
        self._device = check_device(name, device)
        self._reset()

    def _reset(self) -> None:
        self._average_model: AveragedModel | None = None
        self._scheduler: SWALR | None = None
        self._paused: list[Any] = []
        self._max_epochs = -1
        self._latest_update_epoch = -1
        self._pending: dict[str, Any] | None = None  # state loaded before the fit set the average up

    # -- the schedule -------------------------------------------------------------------------------
    @property
    def swa_start(self) -> int:
        """The first SWA epoch (0-based)."""
        start = self._swa_epoch_start
        if isinstance(start, float):
            start = int(self._max_epochs * start)
        return max(start - 1, 0)

    @property
    def swa_end(self) -> int:
        """The last SWA epoch (0-based): the fit's last."""
        return self._max_epochs - 1

    @property
    def average_model(self) -> AveragedModel | None:
        """The averaged copy (``None`` before the fit sets it up)."""
        return self._average_model

    def _in_swa(self, epoch: int) -> bool:
        return self.swa_start <= epoch <= self.swa_end

    # -- hooks ------------------------------------------------------------------------------------
    def setup(self, trainer: Trainer, pl_module: TrainingModule, stage: str) -> None:
        if stage == "fit":
            refuse_sharded(type(self).__name__, trainer)
            self._reset()

    def on_fit_start(self, trainer: Trainer, pl_module: TrainingModule) -> None:
        from torch.optim.swa_utils import AveragedModel

        name = type(self).__name__
        if len(trainer.optimizers) != 1:
            raise ValueError(
                f"{name} anneals the learning rate of one optimizer; configure_optimizers() returned "
                f"{len(trainer.optimizers)}. Use one optimizer (with parameter groups if needed)."
            )
        if trainer.max_epochs < 1:
            raise ValueError(
                f"{name} averages the last epochs of the fit, which needs max_epochs (got {trainer.max_epochs}). "
                f"Set Trainer(max_epochs=...)."
            )
        self._max_epochs = trainer.max_epochs
        if self.swa_start > self.swa_end:
            raise ValueError(
                f"{name}(swa_epoch_start={self._swa_epoch_start}) starts after the last epoch (max_epochs="
                f"{self._max_epochs}), so no weights would be averaged. Use swa_epoch_start <= max_epochs."
            )
        groups = len(trainer.optimizers[0].param_groups)
        if self._lrs_given_per_group and len(self._swa_lrs) != groups:
            raise ValueError(
                f"{name}(swa_lrs={self._swa_lrs}) gives {len(self._swa_lrs)} learning rates, but the optimizer has "
                f"{groups} parameter group(s). Give one per group, or a single float for all."
            )
        self._average_model = AveragedModel(
            pl_module, device=self._device, avg_fn=self._avg_fn, use_buffers=False
        )
        pending, self._pending = self._pending, None
        if pending is not None:  # a resumed fit: the average and the schedule go on where they were
            self._latest_update_epoch = pending["latest_update_epoch"]
            with torch.no_grad():
                params = dict(self._average_model.module.named_parameters())
                for key, value in pending["average"].items():
                    params[key].copy_(value)
                self._average_model.n_averaged.fill_(int(pending["n_averaged"]))
            if pending["scheduler"] is not None:
                self._start(trainer, pending["scheduler"])

    def on_train_epoch_start(self, trainer: Trainer, pl_module: TrainingModule) -> None:
        epoch = trainer.current_epoch
        self._update(epoch - 1, pl_module)  # the weights at the end of the previous epoch
        if not self._in_swa(epoch):
            return
        if self._scheduler is None:
            if epoch != self.swa_start:
                _log.warning(
                    f"[drivetrain] {type(self).__name__}: starting in epoch {epoch}, after swa_start={self.swa_start} "
                    f"(a checkpoint from before this callback was added?); the average covers the epochs from here."
                )
            self._start(trainer, None)
        else:
            with warnings.catch_warnings():
                # A fit resumed at an epoch's end steps it before any optimizer step of this run, which
                # PyTorch takes for the wrong order; the order is right (one step per SWA epoch, at its start).
                warnings.filterwarnings("ignore", "Detected call of `lr_scheduler.step", UserWarning)
                self._scheduler.step()

    def on_train_end(self, trainer: Trainer, pl_module: TrainingModule) -> None:
        self._update(trainer.current_epoch - 1, pl_module)  # the last epoch's weights
        for config in trainer.lr_scheduler_configs:
            if isinstance(config.scheduler, PausedScheduler):
                config.scheduler = config.scheduler.scheduler
        average = self._average_model
        assert average is not None
        if int(average.n_averaged) == 0:
            _log.warning(
                f"[drivetrain] {type(self).__name__}: the fit ended in epoch {trainer.current_epoch - 1}, before SWA "
                f"started (epoch {self.swa_start}); the model keeps its trained weights."
            )
            return
        self.transfer_weights(average.module, pl_module)
        if self.pl_module_contains_batch_norm(pl_module):
            self._update_batch_norm(trainer, pl_module)

    def state_dict(self) -> dict[str, Any]:
        average = self._average_model
        if average is None:
            return self._pending or {}
        scheduler = self._scheduler
        return {
            "latest_update_epoch": self._latest_update_epoch,
            "n_averaged": int(average.n_averaged),
            "average": {key: value.detach().clone() for key, value in average.module.named_parameters()},
            "scheduler": None
            if scheduler is None
            else {
                "step_count": scheduler._step_count,
                "last_epoch": scheduler.last_epoch,
                "base_lrs": list(scheduler.base_lrs),
                "last_lr": list(scheduler.get_last_lr()),
            },
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._pending = dict(state_dict) if state_dict else None

    # -- helpers ----------------------------------------------------------------------------------
    @staticmethod
    def pl_module_contains_batch_norm(pl_module: nn.Module) -> bool:
        """Whether the module has BatchNorm layers (their statistics are recomputed for the average)."""
        return any(isinstance(module, _BatchNorm) for module in pl_module.modules())

    @staticmethod
    @torch.no_grad()
    def transfer_weights(src_pl_module: nn.Module, dst_pl_module: nn.Module) -> None:
        """Copy the parameters of ``src_pl_module`` into ``dst_pl_module`` (each on its own device)."""
        for src, dst in zip(src_pl_module.parameters(), dst_pl_module.parameters(), strict=True):
            dst.copy_(src.to(dst.device))

    def _update(self, epoch: int, module: nn.Module) -> None:
        if epoch > self._latest_update_epoch and self._in_swa(epoch):
            assert self._average_model is not None
            self._average_model.update_parameters(module)
            self._latest_update_epoch = epoch

    def _start(self, trainer: Trainer, saved: dict[str, Any] | None) -> None:
        """Pause the module's schedulers and put the SWA learning rate in charge (``saved``: where it was)."""
        from torch.optim.swa_utils import SWALR

        optimizer = trainer.optimizers[0]
        lrs = self._swa_lrs if len(self._swa_lrs) > 1 else self._swa_lrs * len(optimizer.param_groups)
        for config in trainer.lr_scheduler_configs:
            if not isinstance(config.scheduler, PausedScheduler):
                if saved is None:
                    _log.info(
                        f"[drivetrain] {type(self).__name__}: {type(config.scheduler).__name__} pauses; SWALR sets the "
                        f"learning rate from epoch {self.swa_start}."
                    )
                config.scheduler = PausedScheduler(config.scheduler)
        current = [group["lr"] for group in optimizer.param_groups]
        self._scheduler = SWALR(
            optimizer,
            swa_lr=lrs,  # type: ignore[arg-type]  # one per group is allowed
            anneal_epochs=self._annealing_epochs,
            anneal_strategy=self._annealing_strategy,  # type: ignore[arg-type]
        )
        if saved is not None:  # the constructor stepped once; put the saved position (and rates) back
            scheduler = self._scheduler
            scheduler._step_count = saved["step_count"]
            scheduler.last_epoch = saved["last_epoch"]
            scheduler.base_lrs = list(saved["base_lrs"])
            scheduler._last_lr = list(saved["last_lr"])
            for group, lr in zip(optimizer.param_groups, current, strict=True):
                group["lr"] = lr

    @torch.no_grad()
    def _update_batch_norm(self, trainer: Trainer, module: nn.Module) -> None:
        """BatchNorm statistics for the averaged weights: one pass over the training data, then the mean of the processes."""
        from torch.optim.swa_utils import update_bn

        loader = trainer.train_dataloader
        limit = trainer.num_training_batches
        batches = loader if math.isinf(limit) else itertools.islice(loader, int(limit))
        counted = [0]

        def inputs() -> Any:
            for batch in batches:
                counted[0] += 1
                batch = trainer.strategy.batch_to_device(batch)
                yield batch[0] if isinstance(batch, (list, tuple)) else batch

        update_bn(inputs(), module)
        if trainer.world_size > 1:
            # update_bn's statistics are the mean over batches: weight each process by its batches.
            strategy = trainer.strategy
            count = torch.tensor(float(counted[0]), device=strategy.root_device)
            total = strategy.all_reduce(count.clone(), reduce_op="sum")
            for layer in (m for m in module.modules() if isinstance(m, _BatchNorm)):
                for buffer in (layer.running_mean, layer.running_var):
                    if buffer is not None:
                        summed = strategy.all_reduce(buffer * count, reduce_op="sum")
                        buffer.copy_(summed / total)
                if layer.num_batches_tracked is not None:
                    layer.num_batches_tracked.copy_(
                        strategy.all_reduce(layer.num_batches_tracked, reduce_op="sum")
                    )
        _log.info(
            f"[drivetrain] {type(self).__name__}: BatchNorm statistics recomputed for the averaged weights."
        )
