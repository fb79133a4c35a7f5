"""``WeightAveraging`` and ``EMAWeightAveraging``: keep an average of the weights while training.

The average lives in a :class:`torch.optim.swa_utils.AveragedModel` (a copy of the module).
Validation inside the fit runs on the averaged weights (they are swapped in for it and swapped
back after), checkpoints hold the averaged weights under ``"state_dict"`` (so ``load_from_checkpoint``,
``validate``/``test`` with ``ckpt_path`` and other programs get the average) with the weights being
trained next to them, and when the fit ends the model keeps the averaged weights. Lightning's
behaviour and arguments (2.5+).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from drivetrain._utilities.log import get_logger
from drivetrain.trainer.callbacks.callback import Callback
from drivetrain.trainer.state import TrainerFn

if TYPE_CHECKING:
    from torch.optim.swa_utils import AveragedModel

    from drivetrain.trainer.module import TrainingModule
    from drivetrain.trainer.trainer import Trainer

_log = get_logger(__name__)

#: Checkpoint entries this callback adds next to ``"state_dict"`` (which holds the average).
CURRENT_WEIGHTS = "current_model_state"
AVERAGING_STATE = "averaging_state"
_AVERAGED_MODEL_ARGUMENTS = ("avg_fn", "multi_avg_fn")


def check_device(owner: str, device: Any) -> torch.device | None:
    """``device`` as a ``torch.device`` (``None`` stays ``None``: the module's device), or a clear error."""
    if device is None:
        return None
    if isinstance(device, bool) or not isinstance(device, (str, int, torch.device)):
        raise TypeError(
            f"{owner}(device={device!r}): use None (the module's device), 'cpu', 'cuda:0', an int or a torch.device."
        )
    try:
        return torch.device(device)
    except RuntimeError as error:
        raise ValueError(
            f"{owner}(device={device!r}) is not a device ({error}); use e.g. 'cpu' or 'cuda:0'."
        ) from None


def refuse_sharded(owner: str, trainer: Trainer) -> None:
    """Averaging copies whole parameters; a sharded strategy holds only a shard of each in a process."""
    if trainer.strategy.requires_joint_setup:
        raise ValueError(
            f"{owner} keeps a full copy of the module's weights, but the {type(trainer.strategy).__name__} "
            f"shards them between the processes. Use it with one device or the 'ddp' strategies."
        )


def weights(module: nn.Module, buffers: bool) -> Iterator[Tensor]:
    """The module's parameters (and buffers), in a fixed order."""
    yield from module.parameters()
    if buffers:
        yield from module.buffers()


@torch.no_grad()
def copy_weights(source: nn.Module, target: nn.Module, buffers: bool) -> None:
    for src, dst in zip(weights(source, buffers), weights(target, buffers), strict=True):
        dst.copy_(src.to(dst.device))


class WeightAveraging(Callback):
    """Average the weights during the fit with :class:`torch.optim.swa_utils.AveragedModel`.

    By default the average is updated after every optimizer step; override :meth:`should_update`
    to choose when. The averaged weights are used for validation during the fit, saved in
    checkpoints (``"state_dict"``; the trained weights go in ``"current_model_state"``, and a
    resumed fit continues both) and left in the model when the fit ends.

    Args:
        device: where the averaged copy lives (``None``: the module's device).
        use_buffers: average the buffers too (BatchNorm statistics). With ``False`` the buffers are
            neither averaged nor swapped: validation and the final model use the trained buffers.
        **kwargs: passed to ``AveragedModel``: ``avg_fn`` or ``multi_avg_fn`` (the averaging rule;
            default: the running mean of all updates).

    Example:
        >>> from torch.optim.swa_utils import get_ema_multi_avg_fn
        >>> averaging = WeightAveraging(multi_avg_fn=get_ema_multi_avg_fn(0.99))
    """

    def __init__(
        self, device: torch.device | str | int | None = None, use_buffers: bool = True, **kwargs: Any
    ) -> None:
        name = type(self).__name__
        unknown = sorted(set(kwargs) - set(_AVERAGED_MODEL_ARGUMENTS))
        if unknown:
            raise TypeError(
                f"{name} got unknown argument(s) {', '.join(unknown)}; besides device and use_buffers it passes "
                f"{' and '.join(_AVERAGED_MODEL_ARGUMENTS)} to torch.optim.swa_utils.AveragedModel."
            )
        for key, value in kwargs.items():
            if value is not None and not callable(value):
                raise TypeError(
                    f"{name}({key}={value!r}): pass a function (see torch.optim.swa_utils) or None."
                )
        if not isinstance(use_buffers, bool):
            raise TypeError(f"{name}(use_buffers={use_buffers!r}): use True or False.")
        self._device = check_device(name, device)
        self._use_buffers = use_buffers
        self._kwargs = kwargs
        self._average_model: AveragedModel | None = None
        # Optimizer steps done at the last update: the first update comes after the first step (after
        # ``accumulate_grad_batches`` batches), and a batch without a step never updates.
        self._latest_update_step = 0
        self._latest_update_epoch = -1
        self._swapped = False  # the module holds the average (validation) and the copy the trained weights

    def should_update(self, step_idx: int | None = None, epoch_idx: int | None = None) -> bool:
        """Whether to update the average after optimizer step ``step_idx`` or at the end of epoch ``epoch_idx``.

        Called with one of the two (both 0-based). The default: after every optimizer step.
        """
        return step_idx is not None

    # -- the averaged copy ------------------------------------------------------------------------
    def _ensure_average(self, trainer: Trainer, module: TrainingModule) -> AveragedModel:
        if self._average_model is None:
            from torch.optim.swa_utils import AveragedModel

            refuse_sharded(type(self).__name__, trainer)
            self._average_model = AveragedModel(
                module, device=self._device, use_buffers=self._use_buffers, **self._kwargs
            )
        return self._average_model

    @torch.no_grad()
    def _swap(self, module: nn.Module) -> None:
        assert self._average_model is not None
        self._swapped = not self._swapped
        averaged = self._average_model.module
        for avg, cur in zip(
            weights(averaged, self._use_buffers), weights(module, self._use_buffers), strict=True
        ):
            kept = cur.detach().clone()
            cur.copy_(avg.to(cur.device))
            avg.copy_(kept.to(avg.device))

    def _fitting(self, trainer: Trainer) -> bool:
        return self._average_model is not None and trainer.state.fn == TrainerFn.FITTING

    # -- hooks ------------------------------------------------------------------------------------
    def setup(self, trainer: Trainer, pl_module: TrainingModule, stage: str) -> None:
        if stage == "fit":  # a new fit starts a new average (a resumed one loads it back)
            self._average_model = None
            self._latest_update_step = 0
            self._latest_update_epoch = -1
            self._swapped = False

    def on_fit_start(self, trainer: Trainer, pl_module: TrainingModule) -> None:
        self._ensure_average(trainer, pl_module)

    def _update_after_step(self, trainer: Trainer, module: nn.Module) -> None:
        step = trainer.global_step
        if step > self._latest_update_step:
            if self.should_update(step_idx=step - 1):
                assert self._average_model is not None
                self._average_model.update_parameters(module)
            self._latest_update_step = step

    def _update_at_epoch_end(self, trainer: Trainer, module: nn.Module) -> None:
        epoch = trainer.current_epoch
        if epoch > self._latest_update_epoch:
            if self.should_update(epoch_idx=epoch):
                assert self._average_model is not None
                self._average_model.update_parameters(module)
            self._latest_update_epoch = epoch

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: TrainingModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self._update_after_step(trainer, pl_module)

    def on_train_epoch_end(self, trainer: Trainer, pl_module: TrainingModule) -> None:
        self._update_at_epoch_end(trainer, pl_module)

    def on_train_end(self, trainer: Trainer, pl_module: TrainingModule) -> None:
        assert self._average_model is not None
        copy_weights(self._average_model.module, pl_module, self._use_buffers)

    def on_validation_epoch_start(self, trainer: Trainer, pl_module: TrainingModule) -> None:
        if self._fitting(trainer):
            self._swap(pl_module)

    def on_validation_epoch_end(self, trainer: Trainer, pl_module: TrainingModule) -> None:
        if self._fitting(trainer):
            self._swap(pl_module)

    def state_dict(self) -> dict[str, Any]:
        return {
            "latest_update_step": self._latest_update_step,
            "latest_update_epoch": self._latest_update_epoch,
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._latest_update_step = int(state_dict.get("latest_update_step", 0))
        self._latest_update_epoch = int(state_dict.get("latest_update_epoch", -1))

    def on_save_checkpoint(
        self, trainer: Trainer, pl_module: TrainingModule, checkpoint: dict[str, Any]
    ) -> None:
        if self._average_model is None or "state_dict" not in checkpoint:
            return  # outside a fit: the model's own weights are saved
        if not self._swapped and trainer.state.fn == TrainerFn.FITTING and trainer.training:
            # A checkpoint callback that runs before this one (at a batch or epoch end) saves the average
            # with this step's (epoch's) update in, as a resumed fit would not make it again.
            self._update_after_step(trainer, pl_module)
            if trainer.fit_progress.epoch_ending:
                self._update_at_epoch_end(trainer, pl_module)
        # "state_dict" holds the module's weights (a state dict, as Lightning's hooks see it); the average is a
        # live module the strategy turns into a state dict as it writes. (During validation the two are swapped:
        # the module holds the average.)
        trained, average = checkpoint["state_dict"], self._average_model.module
        if self._swapped:
            trained, average = average, trained
        checkpoint[CURRENT_WEIGHTS] = trained
        checkpoint["state_dict"] = average
        checkpoint[AVERAGING_STATE] = {"n_averaged": self._average_model.n_averaged.detach().clone()}

    def on_load_checkpoint(
        self, trainer: Trainer, pl_module: TrainingModule, checkpoint: dict[str, Any]
    ) -> None:
        if trainer.state.fn != TrainerFn.FITTING:
            return  # evaluation from a checkpoint: its "state_dict" (the average) is what was loaded
        average = self._ensure_average(trainer, pl_module)
        # The checkpoint's "state_dict" (the average, when this callback wrote it) is already in the module.
        current = checkpoint.get(CURRENT_WEIGHTS)
        if current is None:
            _log.warning(
                f"[drivetrain] {type(self).__name__}: the checkpoint holds no averaged weights (it was saved without "
                f"this callback); the average starts from the loaded weights."
            )
            copy_weights(pl_module, average.module, buffers=True)
            return
        copy_weights(pl_module, average.module, buffers=True)
        pl_module.load_state_dict(current)
        state = checkpoint.get(AVERAGING_STATE) or {}
        if "n_averaged" in state:
            average.n_averaged.copy_(torch.as_tensor(state["n_averaged"]))


class EMAWeightAveraging(WeightAveraging):
    """An exponential moving average of the weights: ``average = decay * average + (1 - decay) * weights``.

    The first update copies the weights. Updates come after optimizer steps (every
    ``update_every_n_steps``, from ``update_starting_at_step``), or at epoch ends from
    ``update_starting_at_epoch``.

    Args:
        device: where the averaged copy lives (``None``: the module's device).
        use_buffers: average the buffers too.
        decay: the weight of the old average, in ``[0, 1]``.
        update_every_n_steps: update after every n-th optimizer step (0: not after steps).
        update_starting_at_step: first optimizer step (0-based) that updates (``None``: from the start).
        update_starting_at_epoch: update at the end of each epoch from this one (0-based; ``None``: never at
            epoch ends).

    Example:
        >>> trainer = Trainer(callbacks=[EMAWeightAveraging(decay=0.999)])  # doctest: +SKIP
    """

    def __init__(
        self,
        device: torch.device | str | int | None = None,
        use_buffers: bool = True,
        decay: float = 0.999,
        update_every_n_steps: int = 1,
        update_starting_at_step: int | None = None,
        update_starting_at_epoch: int | None = None,
        **kwargs: Any,
    ) -> None:
        from torch.optim.swa_utils import get_ema_multi_avg_fn

        if isinstance(decay, bool) or not isinstance(decay, (int, float)) or not 0.0 <= decay <= 1.0:
            raise ValueError(f"EMAWeightAveraging(decay={decay!r}): use a number in [0, 1] (e.g. 0.999).")
        for name, value, allow_none in (
            ("update_every_n_steps", update_every_n_steps, False),
            ("update_starting_at_step", update_starting_at_step, True),
            ("update_starting_at_epoch", update_starting_at_epoch, True),
        ):
            if value is None and allow_none:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(
                    f"EMAWeightAveraging({name}={value!r}): use an int >= 0{' or None' if allow_none else ''}."
                )
        if "avg_fn" in kwargs or "multi_avg_fn" in kwargs:
            raise TypeError(
                "EMAWeightAveraging sets its own averaging rule from decay; use WeightAveraging for another."
            )
        super().__init__(
            device=device, use_buffers=use_buffers, multi_avg_fn=get_ema_multi_avg_fn(decay), **kwargs
        )
        self.decay = float(decay)
        self.update_every_n_steps = update_every_n_steps
        self.update_starting_at_step = update_starting_at_step
        self.update_starting_at_epoch = update_starting_at_epoch

    def should_update(self, step_idx: int | None = None, epoch_idx: int | None = None) -> bool:
        if step_idx is not None:
            started = self.update_starting_at_step is None or step_idx >= self.update_starting_at_step
            if started and self.update_every_n_steps > 0 and step_idx % self.update_every_n_steps == 0:
                return True
        if epoch_idx is not None and self.update_starting_at_epoch is not None:
            return epoch_idx >= self.update_starting_at_epoch
        return False
