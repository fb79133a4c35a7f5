"""The run state: everything the Trainer's loops, checkpointing and tuner share about a run.

A :class:`~drivetrain.Trainer` holds its settings and entry points; what a run changes lives in
one :class:`RunState` that the Trainer builds once and hands to the parts that work on it: the
loops (:mod:`drivetrain.trainer.loops`), the data connector, the optimisation step, checkpointing
(:mod:`drivetrain.trainer.checkpointing`) and the tuner. Nothing outside ``trainer.py`` reads the
Trainer's private fields; they read this object, and callbacks read the Trainer's public
properties (``docs/trainer-state.md``), which are views of it.

The tuner's trials change a running fit and must leave no trace: :meth:`RunState.snapshot` and
:meth:`RunState.restore` save and put back *every* field, and one level into the components that
are changed in place (:class:`~drivetrain._utilities.snapshots.Restorable`), so a field added later is restored without anyone
remembering to.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from drivetrain._utilities.snapshots import Restorable, one_level
from drivetrain.trainer.state import EvaluationCounts, FitProgress, TrainerState

if TYPE_CHECKING:
    from torch import nn

    from drivetrain.trainer.arguments import RunFeatures
    from drivetrain.trainer.callbacks.callback import Callback
    from drivetrain.trainer.config import LoopSettings
    from drivetrain.trainer.data_connector import DataConnector
    from drivetrain.trainer.logger_connector import MetricsHub
    from drivetrain.trainer.loops.optimization import Optimization
    from drivetrain.trainer.loops.prediction import PredictionLoop
    from drivetrain.trainer.module import TrainingModule
    from drivetrain.trainer.results import ResultCollection


@dataclasses.dataclass(eq=False)
class RunState:
    """What one Trainer's runs share, grouped by concern (see the module docstring)."""

    # -- settings (the constructor's; the tuner replaces them for its trials) ------------------
    settings: LoopSettings
    features: RunFeatures
    # -- where the run stands ------------------------------------------------------------------
    state: TrainerState
    progress: FitProgress
    # -- metrics and loggers -------------------------------------------------------------------
    metrics: MetricsHub
    # -- callbacks and the hooks resolved for this entry point ---------------------------------
    callbacks: list[Callback]
    #: Batches the evaluation and prediction loops ran (what the Lightning-shaped loop views show).
    evaluation_counts: EvaluationCounts = dataclasses.field(default_factory=EvaluationCounts)
    should_stop: bool = False
    hooks: Any = None  # a HookRunner: one attribute per hook name, set when the entry point starts
    train_results: ResultCollection | None = None
    # -- the module and what the strategy made of it (set by each entry point) -----------------
    module: TrainingModule = None  # type: ignore[assignment]
    compiler: Any = None  # torch.compile's, when fit() got a compiled module: its forward runs compiled
    model: nn.Module = None  # type: ignore[assignment]
    optimizers: list[Any] = dataclasses.field(default_factory=list)
    scheduler_configs: list[Any] = dataclasses.field(default_factory=list)
    manual_optimizers: list[Any] = dataclasses.field(default_factory=list)
    # -- checkpoint to load, and what loading it left for later ---------------------------------
    ckpt_path: str | None = None
    ckpt_request: str | None = None
    ckpt_path_set: str | None = None  # trainer.ckpt_path = ...: used when an entry point names none
    ckpt_weights_only: bool = True
    restored: bool = False
    pending_process: dict[str, Any] | None = None  # this rank's record of a resumed checkpoint
    loaded_checkpoint: dict[str, Any] | None = (
        None  # read whole, through on_load_checkpoint, not yet restored
    )
    # -- processes ------------------------------------------------------------------------------
    strategy_ready: bool = False
    ran_here: bool = False
    return_predictions: bool = True
    predict_loop: PredictionLoop | None = None
    # Built with the run state, for it (they keep a reference to it).
    data: DataConnector = dataclasses.field(init=False)
    optimization: Optimization = dataclasses.field(init=False)

    def snapshot(self) -> dict[str, Any]:
        """Every field, and the inside of each :class:`Restorable` one, as it is now."""
        saved: dict[str, Any] = {}
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            inner = value.snapshot() if isinstance(value, Restorable) else None
            saved[field.name] = (one_level(value), inner)
        return saved

    def restore(self, snapshot: dict[str, Any]) -> None:
        """Every field as :meth:`snapshot` found it (a snapshot can be restored any number of times)."""
        for name, (value, inner) in snapshot.items():
            setattr(self, name, one_level(value))
            if inner is not None:
                value.restore(inner)

    def new_fit(self) -> None:
        """A fit starts from the beginning: no progress, no request to stop."""
        self.progress = FitProgress()
        self.evaluation_counts.forget("fit_validation")
        self.should_stop = False
