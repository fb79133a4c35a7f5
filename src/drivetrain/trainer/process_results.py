"""What a rank hands back to a parent process that is not a rank itself (``ddp_spawn``, ``ddp_fork``).

Under those strategies ``Trainer.fit`` runs in new processes; the caller's own module and
Trainer would stay as they were. Global rank 0 therefore returns its trained weights and the
Trainer's state, and the parent loads them, so ``model`` and ``trainer`` look afterwards as
they do after a fit in the same process.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from drivetrain.trainer.state import TrainerFn

if TYPE_CHECKING:
    from drivetrain.trainer.run_state import RunState
    from drivetrain.trainer.trainer import Trainer


def stage_output(trainer: Trainer, run: RunState, fn: TrainerFn, results: Any) -> dict[str, Any]:
    """The entry point's result and, when the parent is not a rank, the state it needs (called on every rank)."""
    output: dict[str, Any] = {"results": results}
    launcher = trainer.strategy.launcher
    if launcher is None or not launcher.runs_in_spawned_processes:
        return output  # the caller's process ran this itself: its objects are already up to date
    if fn == TrainerFn.FITTING:
        # Every rank takes part (sharded strategies gather); rank 0's copy goes back.
        output["weights"] = trainer.strategy.get_module_state_dict(run.model)
    output["progress"] = run.progress.state_dict()
    output["should_stop"] = run.should_stop
    output["callback_metrics"] = dict(trainer.callback_metrics)
    output["logged_metrics"] = dict(run.metrics.logged)
    output["callbacks"] = {cb.state_key: cb.state_dict() for cb in trainer.callbacks}
    return output


def absorb_output(trainer: Trainer, run: RunState, output: dict[str, Any] | None) -> None:
    """In the parent: load rank 0's trained weights and state into this process's module and Trainer."""
    if output is None:
        return
    module = run.module
    weights = output.get("weights")
    if weights is not None and module is not None:
        if set(weights) - set(module.state_dict()):
            module.configure_model()  # layers the ranks built in configure_model()
        module.load_state_dict(weights)
    run.progress.load_state_dict(output["progress"])
    run.should_stop = output["should_stop"]
    run.metrics.persisted = dict(output["callback_metrics"])
    run.metrics.train = None
    run.metrics.logged.update(output["logged_metrics"])
    states = output["callbacks"]
    for callback in trainer.callbacks:
        if callback.state_key in states:
            callback.load_state_dict(states[callback.state_key])
