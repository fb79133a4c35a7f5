"""Progress bars: the base class, and one built on ``tqdm`` (imported when the first bar opens).

Bars are drawn on global rank 0 only. Messages written while a bar is on screen (drivetrain's
log messages, ``TrainingModule.print``) go above it through tqdm, so the bar line stays whole. To keep the per-step cost near zero the bar counts
batches and redraws at most every ``refresh_interval`` seconds; only then are the ``prog_bar``
metrics read (the one moment their values leave the device).

Output that is not a terminal (a log file, a pipe) gets plain lines instead of redrawn bars (a
bar redraws with carriage returns, which a file keeps as thousands of fragments): one line per
stage when it ends (an epoch, a validation run …), and one at most every ``log_interval``
seconds while it runs.
"""

from __future__ import annotations

import math
import sys
import time
from typing import TYPE_CHECKING, Any

from drivetrain._utilities import console
from drivetrain.trainer.callbacks.callback import Callback
from drivetrain.trainer.callbacks.plain_progress import PlainProgress, is_terminal, short

if TYPE_CHECKING:
    from drivetrain.trainer.module import TrainingModule
    from drivetrain.trainer.trainer import Trainer


class ProgressBar(Callback):
    """Base class for progress bars; the Trainer adds a :class:`TQDMProgressBar` unless one is given."""

    _enabled = True
    #: The model summary the Trainer adds by default next to this bar: ``"plain"`` or ``"rich"``
    #: (:class:`~drivetrain.trainer.callbacks.RichModelSummary`, as Lightning pairs it with its rich bar).
    summary_style = "plain"

    def enable(self) -> None:
        self._enabled = True

    def disable(self) -> None:
        self._enabled = False

    @property
    def is_enabled(self) -> bool:
        return self._enabled

    def get_metrics(self, trainer: Trainer, pl_module: TrainingModule) -> dict[str, float | str]:
        """What the bar shows next to the counts: the ``prog_bar=True`` metrics."""
        return dict(trainer.progress_bar_metrics)

    def print(self, *args: Any, **kwargs: Any) -> None:
        """``print`` (same arguments) above the bars, leaving them intact (``TrainingModule.print`` does this)."""
        console.print_line(*args, **kwargs)


class _Bar:
    """One tqdm bar with throttled redraws."""

    def __init__(self, bar: Any, interval: float, every: int = 0) -> None:
        self.bar = bar
        self.pending = 0
        self.interval = interval
        self.every = every
        self.next_draw = 0.0

    def advance(self, postfix: Any = None) -> None:
        self.pending += 1
        if self.every:  # a batch count (Lightning's refresh_rate) instead of a time
            if self.pending >= self.every:
                self.draw(postfix, 0.0)
            return
        now = time.monotonic()
        if now >= self.next_draw:
            self.draw(postfix, now)

    def draw(self, postfix: Any = None, now: float | None = None) -> None:
        if postfix is not None:
            metrics = postfix() if callable(postfix) else postfix
            if metrics:
                self.bar.set_postfix({k: short(v) for k, v in metrics.items()}, refresh=False)
        self.bar.update(self.pending)
        self.pending = 0
        self.next_draw = (now if now is not None else time.monotonic()) + self.interval

    def close(self, postfix: Any = None) -> None:
        self.draw(postfix)
        self.bar.close()

    def discard(self) -> None:
        self.bar.close()


class StageBars(ProgressBar):
    """What the built-in bars share: one bar per epoch of training and one per evaluation, counting
    batches, with the ``prog_bar`` metrics; plain lines when the output is not a terminal.

    Subclasses provide :meth:`_bar`.
    """

    def __init__(
        self,
        refresh_rate: int | None,
        leave: bool,
        refresh_interval: float | None,
        log_interval: float,
    ) -> None:
        kind = type(self).__name__
        if refresh_rate is not None:
            if isinstance(refresh_rate, bool) or not isinstance(refresh_rate, int) or refresh_rate < 0:
                raise ValueError(
                    f"{kind}(refresh_rate={refresh_rate!r}); use a number of batches >= 1 (0 turns the bar "
                    f"off), or refresh_interval=<seconds>."
                )
            if refresh_interval is not None:
                raise ValueError(
                    f"{kind}(refresh_rate={refresh_rate}, refresh_interval={refresh_interval}): give one; "
                    f"refresh_rate counts batches, refresh_interval seconds."
                )
        if refresh_interval is not None and refresh_interval < 0:
            raise ValueError(f"{kind}(refresh_interval={refresh_interval}); use a value >= 0.")
        if isinstance(log_interval, bool) or not isinstance(log_interval, (int, float)) or log_interval < 0:
            raise ValueError(f"{kind}(log_interval={log_interval!r}); use a number of seconds >= 0.")
        self.log_interval = float(log_interval)
        self.refresh_rate = refresh_rate
        self.refresh_interval = refresh_interval if refresh_interval is not None else 0.1
        self.leave = leave
        if refresh_rate == 0:
            self.disable()
        self._train: Any = None
        self._eval: Any = None
        self._shown: dict[str, Any] = {}  # the latest bar of each stage, kept after it closes (Lightning's)
        self._trainer: Trainer | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.update(
            _train=None, _eval=None, _shown={}, _trainer=None
        )  # drawing objects stay in this process
        return state

    @property
    def trainer(self) -> Trainer:
        """The Trainer this bar draws for (set when an entry point starts)."""
        if self._trainer is None:
            raise TypeError(f"{type(self).__name__}.trainer is set when fit/validate/test/predict starts.")
        return self._trainer

    @property
    def total_train_batches(self) -> int | float:
        """The training batches the epoch's bar counts to (fewer when ``max_steps`` ends the fit first)."""
        trainer = self.trainer
        if trainer.max_epochs == -1 and trainer.max_steps > 0:
            return min(trainer.num_training_batches, trainer.max_steps - trainer.global_step)
        return trainer.num_training_batches

    @property
    def total_val_batches(self) -> int | float:
        """The validation batches of this epoch over every loader (0 in an epoch without validation)."""
        trainer = self.trainer
        every = trainer.check_val_every_n_epoch
        if not sum(trainer.num_val_batches) or (every is not None and (trainer.current_epoch + 1) % every):
            return 0
        return sum(trainer.num_val_batches)

    @property
    def train_progress_bar(self) -> Any:
        """The current (or last) epoch's bar: a ``tqdm`` on a terminal, plain lines (``n``, ``total``) elsewhere."""
        return self._drawn("train")

    @property
    def val_progress_bar(self) -> Any:
        """The current (or last) validation's bar (the sanity check's included)."""
        return self._drawn("val")

    @property
    def test_progress_bar(self) -> Any:
        return self._drawn("test")

    @property
    def predict_progress_bar(self) -> Any:
        return self._drawn("predict")

    def _drawn(self, stage: str) -> Any:
        shown = self._shown.get(stage)
        if shown is None:
            raise TypeError(
                f"{type(self).__name__}.{stage}_progress_bar does not exist yet: it is made when the first "
                f"{stage} stage starts (on global rank 0, with the bar enabled)."
            )
        return getattr(shown, "bar", shown)

    def _bar(self, description: str, total: float, *, training: bool, transient: bool = False) -> Any:
        """A bar for one stage: ``advance(postfix)``, ``draw(postfix)``, ``close(postfix)``, ``discard()``.

        ``training``: an epoch's bar (else an evaluation's); ``transient``: gone once closed (validation
        inside a fit), where the drawing allows it.
        """
        raise NotImplementedError

    def setup(self, trainer: Trainer, pl_module: TrainingModule, stage: str) -> None:
        self._trainer = trainer
        if not trainer.is_global_zero:
            self.disable()

    def teardown(self, trainer: Trainer, pl_module: TrainingModule, stage: str) -> None:
        for bar in (self._train, self._eval):
            if bar is not None:
                bar.discard()
        self._train = self._eval = None  # drawing objects must not travel with a pickled Trainer

    def _metrics(self, trainer: Trainer, pl_module: TrainingModule) -> Any:
        return lambda: self.get_metrics(trainer, pl_module)

    # -- training -------------------------------------------------------------------------------
    def on_train_epoch_start(self, trainer: Trainer, pl_module: TrainingModule) -> None:
        if not self._enabled:
            return
        self._train = self._shown["train"] = self._bar(
            f"Epoch {trainer.current_epoch}", trainer.num_training_batches, training=True
        )

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: TrainingModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        bar = self._train
        if bar is not None:
            bar.advance(self._metrics(trainer, pl_module))

    def on_train_epoch_end(self, trainer: Trainer, pl_module: TrainingModule) -> None:
        if self._train is not None:
            self._train.close(self._metrics(trainer, pl_module))
            self._train = None

    # -- evaluation ------------------------------------------------------------------------------
    def _open_eval(
        self, stage: str, description: str, lengths: list[int | float], transient: bool = False
    ) -> None:
        if not self._enabled:
            return
        total = sum(lengths) if lengths else 0
        self._eval = self._shown[stage] = self._bar(description, total, training=False, transient=transient)

    def _advance_eval(self) -> None:
        if self._eval is not None:
            self._eval.advance()

    def _close_eval(self) -> None:
        if self._eval is not None:
            self._eval.close()
            self._eval = None

    def on_validation_start(self, trainer: Trainer, pl_module: TrainingModule) -> None:
        if trainer.sanity_checking:
            self._open_eval("val", "Sanity checking", trainer.num_sanity_val_batches, transient=True)
        else:
            self._open_eval("val", "Validation", trainer.num_val_batches, transient=True)

    def on_validation_batch_end(self, *args: Any, **kwargs: Any) -> None:
        self._advance_eval()

    def on_validation_end(self, trainer: Trainer, pl_module: TrainingModule) -> None:
        self._close_eval()
        if self._train is not None and not trainer.sanity_checking:
            self._train.draw(self._metrics(trainer, pl_module))

    def on_test_start(self, trainer: Trainer, pl_module: TrainingModule) -> None:
        self._open_eval("test", "Testing", trainer.num_test_batches)

    def on_test_batch_end(self, *args: Any, **kwargs: Any) -> None:
        self._advance_eval()

    def on_test_end(self, trainer: Trainer, pl_module: TrainingModule) -> None:
        self._close_eval()

    def on_predict_start(self, trainer: Trainer, pl_module: TrainingModule) -> None:
        self._open_eval("predict", "Predicting", trainer.num_predict_batches)

    def on_predict_batch_end(self, *args: Any, **kwargs: Any) -> None:
        self._advance_eval()

    def on_predict_end(self, trainer: Trainer, pl_module: TrainingModule) -> None:
        self._close_eval()

    def on_exception(self, trainer: Trainer, pl_module: TrainingModule, exception: BaseException) -> None:
        self.teardown(trainer, pl_module, "")


class TQDMProgressBar(StageBars):
    """Bars for training epochs, validation, test and predict, drawn with ``tqdm`` on global rank 0.

    Args:
        refresh_rate: redraw every this many batches, as in Lightning (``0`` turns the bar off).
            Unset, the bar redraws by time (``refresh_interval``), which costs less on fast steps.
        leave: keep each epoch's training bar on screen when the next begins.
        refresh_interval: the least time in seconds between two redraws (when ``refresh_rate`` is unset).
        log_interval: when standard error is not a terminal (a log file), the least time in seconds
            between two progress lines; each epoch and evaluation also gets a line when it ends.
    """

    def __init__(
        self,
        refresh_rate: int | None = None,
        leave: bool = True,
        *,
        refresh_interval: float | None = None,
        log_interval: float = 30.0,
    ) -> None:
        super().__init__(refresh_rate, leave, refresh_interval, log_interval)

    # -- Lightning's customisation points: each returns the tqdm bar of one stage ------------------
    def init_sanity_tqdm(self) -> Any:
        """The bar of the sanity check (override to change it; ``bar.disable = True`` hides it)."""
        return self._tqdm("Sanity checking", leave=False, position=self._eval_position())

    def init_train_tqdm(self) -> Any:
        """The bar of each training epoch (its description and total are set when the epoch starts)."""
        return self._tqdm("Training", leave=self.leave, position=0)

    def init_validation_tqdm(self) -> Any:
        """The bar of a validation run (inside a fit: below the epoch's bar, gone when it ends)."""
        return self._tqdm("Validation", leave=False, position=self._eval_position())

    def init_test_tqdm(self) -> Any:
        """The bar of ``trainer.test``."""
        return self._tqdm("Testing", leave=False, position=0)

    def init_predict_tqdm(self) -> Any:
        """The bar of ``trainer.predict``."""
        return self._tqdm("Predicting", leave=False, position=0)

    def _eval_position(self) -> int:
        return 1 if self._train is not None else 0

    def _tqdm(self, description: str, *, leave: bool, position: int) -> Any:
        from tqdm import tqdm

        return tqdm(
            desc=description,
            leave=leave,
            position=position,
            dynamic_ncols=True,
            file=sys.stderr,
            mininterval=0,
            smoothing=0,
            delay=1e-9,  # nothing drawn until the total is set (or an override switches the bar off)
        )

    def _bar(self, description: str, total: float, *, training: bool, transient: bool = False) -> Any:
        init = "init_train_tqdm" if training else _INIT_FOR[description]
        overridden = getattr(type(self), init) is not getattr(TQDMProgressBar, init)
        if not overridden and not is_terminal(sys.stderr):
            return PlainProgress(description, total, console.write, self.log_interval)
        # An overridden init_*_tqdm is drawn as it returns it (a log file included), as in Lightning; the
        # total and, for an epoch, the description are set here.
        bar = getattr(self, init)()
        bar.reset(total=None if math.isinf(total) else int(total))
        if training or not overridden:
            bar.set_description(description, refresh=False)
        return _Bar(bar, self.refresh_interval, self.refresh_rate or 0)


_INIT_FOR = {
    "Sanity checking": "init_sanity_tqdm",
    "Validation": "init_validation_tqdm",
    "Testing": "init_test_tqdm",
    "Predicting": "init_predict_tqdm",
}
