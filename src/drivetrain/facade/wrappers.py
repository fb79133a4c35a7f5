"""What ``Accelerator.prepare`` hands back for optimizers and schedulers (the forward wrapper is
:class:`drivetrain.plugins.precision.forward.PrecisionForward`).

The prepared optimizer and scheduler drop into user code where the originals were. They step
only at the end of an accumulation window (and the scheduler only when the optimizer really
stepped), which is what makes ``with accelerator.accumulate(model):`` loops correct without
changing the loop.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from torch import nn
from torch.optim import Optimizer

if TYPE_CHECKING:
    from drivetrain.facade.state import GradientState
    from drivetrain.plugins.precision.precision import Precision
    from drivetrain.strategies.strategy import Strategy

_DELEGATED_HOOKS = (
    "register_step_pre_hook",
    "register_step_post_hook",
    "register_state_dict_pre_hook",
    "register_state_dict_post_hook",
    "register_load_state_dict_pre_hook",
    "register_load_state_dict_post_hook",
)


class PreparedOptimizer(Optimizer):
    """The user's optimizer, stepped through the strategy (loss scaling, sharding).

    A ``torch.optim.Optimizer`` itself, so learning-rate schedulers accept it. ``step`` and
    ``zero_grad`` do nothing while gradients are being accumulated.

    Args:
        optimizer: the optimizer to wrap (available as ``.optimizer``).
        strategy: steps it.
        gradient_state: says whether this batch ends an accumulation window.
        model: the module it optimizes, for strategies that need it.
    """

    def __init__(
        self,
        optimizer: Optimizer,
        strategy: Strategy,
        gradient_state: GradientState,
        model: nn.Module | None = None,
    ) -> None:
        # torch's Optimizer.__init__ is deliberately not called: the wrapped optimizer holds the state.
        self.optimizer = optimizer
        self._gradient_state = gradient_state
        # The strategy picks the call (the plain ``optimizer.step()`` where it adds nothing).
        self._strategy_step = strategy.step_functions().optimizer_step
        self._precision: Precision = strategy.precision
        self._model = model

    # -- the per-step path -------------------------------------------------------------------
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """Step the optimizer (through the strategy) unless gradients are being accumulated."""
        if self._gradient_state.sync_gradients:
            return self._strategy_step(self.optimizer, closure, self._model)
        return None

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Reset the gradients unless they are being accumulated."""
        if self._gradient_state.sync_gradients:
            # torch's zero_grad is measurably slower when set_to_none is passed, even as its default.
            if set_to_none:
                self.optimizer.zero_grad()
            else:
                self.optimizer.zero_grad(set_to_none=False)

    @property
    def step_was_skipped(self) -> bool:
        """Whether the latest step was skipped because fp16 gradients overflowed."""
        return self._precision.last_step_skipped

    # -- the wrapped optimizer's state ------------------------------------------------------
    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return self.optimizer.param_groups

    @param_groups.setter
    def param_groups(self, value: list[dict[str, Any]]) -> None:
        self.optimizer.param_groups = value

    @property
    def defaults(self) -> dict[str, Any]:
        return self.optimizer.defaults

    @defaults.setter
    def defaults(self, value: dict[str, Any]) -> None:
        self.optimizer.defaults = value

    @property
    def state(self) -> Any:
        return self.optimizer.state

    @state.setter
    def state(self, value: Any) -> None:
        self.optimizer.state = value

    def state_dict(self) -> dict[str, Any]:
        return self.optimizer.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state_dict)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        self.optimizer.add_param_group(param_group)

    def __getattr__(self, name: str) -> Any:
        if name == "optimizer":  # not set yet (unpickling): avoid recursing
            raise AttributeError(name)
        return getattr(self.optimizer, name)

    def __getstate__(self) -> dict[str, Any]:
        return dict(self.__dict__)

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    def __repr__(self) -> str:
        return f"PreparedOptimizer({self.optimizer!r})"


def _delegate(name: str) -> Callable[..., Any]:
    def method(self: PreparedOptimizer, *args: Any, **kwargs: Any) -> Any:
        return getattr(self.optimizer, name)(*args, **kwargs)

    method.__name__ = name
    method.__doc__ = f"``{name}`` of the wrapped optimizer."
    return method


for _name in _DELEGATED_HOOKS:
    setattr(PreparedOptimizer, _name, _delegate(_name))


class PreparedScheduler:
    """The user's learning-rate scheduler, stepped only when its optimizers really stepped.

    With ``split_batches=False`` each step of ``N`` processes consumes ``N`` batches, so the
    scheduler advances ``N`` steps: a schedule written for the batches of one process ends where
    it should (as in Accelerate). It never steps past a ``OneCycleLR``'s ``total_steps``.

    Args:
        scheduler: the scheduler to wrap (available as ``.scheduler``).
        optimizers: the prepared optimizers it follows.
        gradient_state: says whether this batch ends an accumulation window.
        num_processes: steps to advance per optimizer step (1 when batches are split).
        step_with_optimizer: ``False`` steps the scheduler on every call (epoch-based schedules).
    """

    def __init__(
        self,
        scheduler: Any,
        optimizers: list[PreparedOptimizer],
        gradient_state: GradientState,
        num_processes: int = 1,
        step_with_optimizer: bool = True,
    ) -> None:
        self.scheduler = scheduler
        self.optimizers = optimizers
        self._gradient_state = gradient_state
        self._steps_per_step = num_processes
        self.step_with_optimizer = step_with_optimizer

    def step(self, *args: Any, **kwargs: Any) -> None:
        """Advance the schedule if the optimizers stepped (see the class docstring)."""
        if not self.step_with_optimizer:
            self.scheduler.step(*args, **kwargs)
            return
        if not self._gradient_state.sync_gradients:
            return
        for optimizer in self.optimizers:
            if optimizer.step_was_skipped:
                return
        total = getattr(self.scheduler, "total_steps", None)
        for _ in range(self._steps_per_step):
            if total is not None and self.scheduler.last_epoch >= total:
                return
            self.scheduler.step(*args, **kwargs)

    def state_dict(self) -> dict[str, Any]:
        return self.scheduler.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.scheduler.load_state_dict(state_dict)

    def get_last_lr(self) -> list[float]:
        return self.scheduler.get_last_lr()

    def __getattr__(self, name: str) -> Any:
        if name == "scheduler":
            raise AttributeError(name)
        return getattr(self.scheduler, name)

    def __repr__(self) -> str:
        return f"PreparedScheduler({self.scheduler!r})"
