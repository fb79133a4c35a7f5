"""Short training runs inside a fit, and putting everything back after them.

The tuner's searches run where a fit has set everything up (the strategy, the wrapped model, the
optimizers, the loaders): in ``on_fit_start`` of :class:`~drivetrain.trainer.callbacks.LearningRateFinder`
and :class:`~drivetrain.trainer.callbacks.BatchSizeFinder`, which ``Tuner`` adds for one fit that ends
there. :func:`run_steps` trains a few optimizer steps through the Trainer's own fit loop and step (so
precision, accumulation, clipping and the strategy's backward all apply), with only the given
callbacks, no loggers, no validation and none of the module's schedulers.
:class:`TuningSession` saves what such runs change (weights, optimizer, scheduler and precision
state, loop progress, logged values, the loaders, the random generators) and restores it after.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

from drivetrain.strategies import rng
from drivetrain.trainer.hooks import hook_runner
from drivetrain.trainer.loops.fit import FitLoop
from drivetrain.trainer.results import ResultCollection, collectives_of
from drivetrain.trainer.state import RunningStage, TrainerFn

if TYPE_CHECKING:
    from drivetrain.trainer.callbacks.callback import Callback
    from drivetrain.trainer.loops.fit import FitLoop
    from drivetrain.trainer.trainer import Trainer


class TuningSession:
    """The state of a running fit that trials change, kept in memory: :meth:`restore` puts it back.

    The training state (weights, optimizer, scheduler and precision state, random generators) and
    the whole run state (:class:`~drivetrain.trainer.run_state.RunState`: settings, progress,
    callbacks, hooks, logged values, loaders …), so nothing a trial changes there is forgotten.
    """

    def __init__(self, trainer: Trainer) -> None:
        self.trainer = trainer
        run = self.run = trainer.run_state
        module = run.module
        self.weights = {name: value.detach().clone() for name, value in module.state_dict().items()}
        self.optimizers = [copy.deepcopy(optimizer.state_dict()) for optimizer in run.optimizers]
        self.schedulers = [copy.deepcopy(config.scheduler.state_dict()) for config in run.scheduler_configs]
        self.precision = copy.deepcopy(trainer.strategy.precision.state_dict())
        self.rng = rng.capture(trainer.strategy)
        self.module_results = module._results
        self.saved = run.snapshot()

    def restore(self) -> None:
        """Everything as when the session started (also the start of every batch-size trial)."""
        trainer, run = self.trainer, self.run
        run.restore(self.saved)
        module = run.module
        module.load_state_dict(self.weights)
        for optimizer, state in zip(run.optimizers, self.optimizers):
            optimizer.load_state_dict(copy.deepcopy(state))
            optimizer.zero_grad(set_to_none=True)
        for config, state in zip(run.scheduler_configs, self.schedulers):
            config.scheduler.load_state_dict(copy.deepcopy(state))
        trainer.strategy.precision.load_state_dict(copy.deepcopy(self.precision))
        rng.restore(trainer.strategy, self.rng)
        module._results = self.module_results
        # The step binds the progress, hooks and schedulers of the fit: bind them again.
        run.optimization.setup(run.optimizers, run.scheduler_configs)


@contextlib.contextmanager
def tuning_session(trainer: Trainer) -> Iterator[TuningSession]:
    """Everything trials change is as before when the block ends (also after an error)."""
    if trainer.state.fn != TrainerFn.FITTING or not trainer.run_state.optimizers:
        raise RuntimeError(
            "The tuner runs inside trainer.fit(), after the optimizers are set up (in on_fit_start); "
            f"the trainer is running {trainer.state.fn.value if trainer.state.fn else 'nothing'}."
        )
    session = TuningSession(trainer)
    try:
        yield session
    finally:
        session.restore()


def reload_train_data(trainer: Trainer) -> None:
    """Build the fit's loaders again (after the batch size they read has changed)."""
    trainer.run_state.data.setup(TrainerFn.FITTING)


def run_steps(trainer: Trainer, max_steps: int, callbacks: Sequence[Callback] = ()) -> int:
    """Train ``max_steps`` optimizer steps in this fit (fewer when a callback sets ``trainer.should_stop``, or
    when the fit's ``max_epochs`` end first).

    Runs inside :func:`tuning_session`, through the fit loop (more epochs than one when the loader
    is short), with ``callbacks`` only, without loggers, validation or the module's schedulers.
    Returns the steps taken.
    """
    return train_steps(trainer, prepare_steps(trainer, max_steps, callbacks))


def prepare_steps(trainer: Trainer, max_steps: int, callbacks: Sequence[Callback] = ()) -> FitLoop:
    """Set the Trainer up for :func:`train_steps` (what the previous trial left behind is released here)."""

    run = trainer.run_state
    settings = run.settings
    # Each epoch trains at least one batch, so this many epochs make the steps (a module that skips every
    # batch cannot keep the loop going forever). The fit's own max_epochs still ends the run, as in Lightning.
    epochs = max_steps * settings.accumulate_grad_batches
    run.settings = dataclasses.replace(
        settings,
        max_steps=max_steps,
        max_epochs=epochs if settings.max_epochs == -1 else min(settings.max_epochs, epochs),
        min_epochs=0,
        min_steps=0,
        max_time=None,
        num_sanity_val_steps=0,
    )
    run.new_fit()
    run.callbacks = list(callbacks)
    run.hooks = hook_runner(trainer, run)
    run.scheduler_configs = []
    run.train_results = run.metrics.train = ResultCollection(True, *collectives_of(trainer.strategy))
    run.metrics.loggers = []
    run.data.validation_enabled = False
    run.optimization.setup(run.optimizers, [])
    run.state.stage = RunningStage.TRAINING
    return FitLoop(trainer, run)


def train_steps(trainer: Trainer, loop: FitLoop) -> int:
    """Run the epochs of a loop from :func:`prepare_steps` until its steps are done; returns the steps."""
    while not loop.done():
        loop.run_epoch()
    return trainer.run_state.progress.global_step
