"""``PartialState`` and ``AcceleratorState``: Accelerate's process-level state, as views.

Accelerate keeps these as process-wide singletons that tests must reset. Here they are views:
each instance reads the facts (rank, world size, device, distributed type …) from the
``drivetrain.Accelerator`` it belongs to, and its methods (``wait_for_everyone``, ``print``,
``split_between_processes`` …) are that Accelerator's. Two Accelerators in one process keep
their own states.

Which Accelerator: ``accelerator.state`` is its own. ``PartialState()`` and ``AcceleratorState()``
built by a script view the latest live Accelerator of the process (as the free functions of
:mod:`drivetrain.utils` do). Built before any Accelerator exists (Accelerate's ``test_ops``
style: ``state = PartialState(); gather(...)``), the first one joins the processes the launcher
started through a plain ``drivetrain.Accelerator(cpu=cpu)``, which is kept for the process so that
later ``PartialState()`` calls and the free functions find it.

The facts are properties; the only attributes an instance holds in its ``__dict__`` are the
values a script assigned (``state.distributed_type = ...``, as Accelerate's tests do), so a
pickled and restored Accelerator has an equal ``state.__dict__``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import torch

from drivetrain.utils import current

if TYPE_CHECKING:
    from drivetrain.facade.accelerator import Accelerator
    from drivetrain.strategies.strategy import Strategy
    from drivetrain.utils.configuration import DistributedType
    from drivetrain.utils.dynamo import TorchDynamoPlugin


def distributed_type_of(strategy: Strategy, device: torch.device) -> DistributedType:
    """Accelerate's name for how ``strategy`` organises the processes."""
    from drivetrain.utils.configuration import DistributedType

    kind = {
        "deepspeed": DistributedType.DEEPSPEED,
        "fsdp": DistributedType.FSDP,
        "model_parallel": DistributedType.FSDP,  # FSDP2 on the layout's data-parallel mesh
        "xla": DistributedType.XLA,
    }.get(strategy.kind)
    if kind is not None:
        return kind
    if strategy.world_size == 1:
        return DistributedType.NO
    return {
        "cuda": DistributedType.MULTI_GPU,
        "xpu": DistributedType.MULTI_XPU,
        "mps": DistributedType.MULTI_MPS,
    }.get(device.type, DistributedType.MULTI_CPU)


class PartialState:
    """This process's place in the run: rank, world size, device, and the process-control methods.

    Args:
        cpu: when no ``drivetrain.Accelerator`` exists yet, join the run on the CPU.
        **kwargs: Accelerate's other arguments (process-group settings) are not taken here: pass
            them to ``drivetrain.Accelerator``.

    Raises:
        TypeError: an argument drivetrain does not take here.
    """

    __slots__ = ("__dict__", "_owner")
    _owner: Accelerator

    def __init__(self, cpu: bool = False, **kwargs: Any) -> None:
        if kwargs:
            raise TypeError(
                f"{type(self).__name__}({', '.join(kwargs)}=...) is not supported: the state is a view of a "
                f"drivetrain.Accelerator; pass process-group and precision settings to drivetrain.Accelerator(...) "
                f"and read its .state."
            )
        object.__setattr__(self, "_owner", current.owner_or_implicit(cpu))

    @classmethod
    def _view(cls, owner: Accelerator) -> Any:
        state = cls.__new__(cls)
        object.__setattr__(state, "_owner", owner)
        return state

    @classmethod
    def _reset_state(cls, reset_partial_state: bool = False) -> None:
        """Accelerate resets its singletons here; drivetrain has none (each Accelerator owns its state)."""

    # -- facts -----------------------------------------------------------------------------
    @property
    def initialized(self) -> bool:
        return True

    @property
    def device(self) -> torch.device:
        return self._owner.device

    @property
    def num_processes(self) -> int:
        return self._owner.num_processes

    @property
    def process_index(self) -> int:
        return self._owner.process_index

    @property
    def local_process_index(self) -> int:
        return self._owner.local_process_index

    @property
    def is_main_process(self) -> bool:
        return self._owner.is_main_process

    @property
    def is_local_main_process(self) -> bool:
        return self._owner.is_local_main_process

    @property
    def is_last_process(self) -> bool:
        return self._owner.is_last_process

    @property
    def use_distributed(self) -> bool:
        return self._owner.use_distributed

    @property
    def backend(self) -> str | None:
        """The process group's backend (``"gloo"``, ``"nccl"`` …), ``None`` with one process."""
        return getattr(self._owner.strategy, "process_group_backend", None) if self.use_distributed else None

    @property
    def distributed_type(self) -> DistributedType:
        """How the processes are organised; a script may assign it (as Accelerate's tests do)."""
        assigned = self.__dict__.get("distributed_type")
        if assigned is not None:
            return assigned
        return distributed_type_of(self._owner.strategy, self._owner.device)

    @distributed_type.setter
    def distributed_type(self, value: DistributedType) -> None:
        from drivetrain.utils.configuration import DistributedType

        self.__dict__["distributed_type"] = DistributedType(value)

    @property
    def debug(self) -> bool:
        """Whether every collective first checks that all processes call it alike (assignable on every rank)."""
        return bool(getattr(self._owner.strategy, "debug_collectives", False))

    @debug.setter
    def debug(self, value: bool) -> None:
        strategy = self._owner.strategy
        if hasattr(type(strategy), "debug_collectives"):
            strategy.debug_collectives = value  # type: ignore[attr-defined]
        # One process has no collectives that could disagree: nothing to check.

    # -- process control: the owning Accelerator's ---------------------------------------
    def wait_for_everyone(self) -> None:
        """Block until every process reaches this point."""
        self._owner.wait_for_everyone()

    def print(self, *args: Any, **kwargs: Any) -> None:
        """``print`` on the local main process only."""
        self._owner.print(*args, **kwargs)

    @contextmanager
    def main_process_first(self) -> Iterator[None]:
        """Run the block on the main process first, then on the others."""
        with self._owner.main_process_first():
            yield

    @contextmanager
    def local_main_process_first(self) -> Iterator[None]:
        """Run the block on each node's local main process first, then on its others."""
        with self._owner.local_main_process_first():
            yield

    def split_between_processes(self, inputs: Any, apply_padding: bool = False) -> Any:
        """Context manager giving this process its share of a list, tuple, tensor or dict of them."""
        return self._owner.split_between_processes(inputs, apply_padding)

    def on_main_process(self, function: Callable[..., Any]) -> Callable[..., Any]:
        return self._owner.on_main_process(function)

    def on_local_main_process(self, function: Callable[..., Any]) -> Callable[..., Any]:
        return self._owner.on_local_main_process(function)

    def on_last_process(self, function: Callable[..., Any]) -> Callable[..., Any]:
        return self._owner.on_last_process(function)

    def on_process(self, function: Callable[..., Any] | None = None, process_index: int | None = None) -> Any:
        return self._owner.on_process(function, process_index=process_index)

    def on_local_process(
        self, function: Callable[..., Any] | None = None, local_process_index: int | None = None
    ) -> Any:
        return self._owner.on_local_process(function, local_process_index=local_process_index)

    def destroy_process_group(self, group: Any = None) -> None:
        """Leave the run's process group (collectives fail afterwards), as at the end of a script."""
        if group is not None:
            raise ValueError(
                "destroy_process_group(group=...) is not supported: it leaves the run's own group."
            )
        self._owner.strategy.teardown()

    def __setattr__(self, name: str, value: Any) -> None:
        fact = getattr(type(self), name, None)
        if name == "_owner" or (isinstance(fact, property) and fact.fset is not None):
            object.__setattr__(self, name, value)  # a settable fact (distributed_type, debug)
            return
        raise AttributeError(
            f"{type(self).__name__}.{name} cannot be set: the state is a view of the Accelerator's processes."
        )

    def __repr__(self) -> str:
        return (
            f"Distributed environment: {self.distributed_type.value}{f'  Backend: {self.backend}' if self.backend else ''}\n"
            f"Num processes: {self.num_processes}\nProcess index: {self.process_index}\n"
            f"Local process index: {self.local_process_index}\nDevice: {self.device}\n"
        )


class DeepSpeedSettings:
    """What a DeepSpeed run's strategy was given, under Accelerate's ``DeepSpeedPlugin`` attribute names."""

    def __init__(self, strategy: Any) -> None:
        self._strategy = strategy

    @property
    def deepspeed_config(self) -> dict[str, Any]:
        """The DeepSpeed config (``"auto"`` values are filled when the model is prepared)."""
        config: dict[str, Any] = self._strategy.config
        return config

    @property
    def zero_stage(self) -> int:
        stage: int = self._strategy.stage
        return stage

    @property
    def gradient_accumulation_steps(self) -> Any:
        return self.deepspeed_config.get("gradient_accumulation_steps", "auto")

    @property
    def gradient_clipping(self) -> Any:
        return self.deepspeed_config.get("gradient_clipping", "auto")

    def __repr__(self) -> str:
        return f"DeepSpeedSettings(zero_stage={self.zero_stage}, deepspeed_config={self.deepspeed_config})"


class AcceleratorState(PartialState):
    """:class:`PartialState` plus what the Accelerator adds: its precision.

    ``accelerator.state`` is one; ``AcceleratorState()`` views the latest live Accelerator.
    """

    __slots__ = ()

    @property
    def mixed_precision(self) -> str:
        """``"no"``, ``"fp16"``, ``"bf16"``, or drivetrain's name for other precisions."""
        return self._owner.mixed_precision

    @property
    def dynamo_plugin(self) -> TorchDynamoPlugin:
        """How ``prepare`` compiles models (backend ``NO``: it does not)."""
        return self._owner.dynamo_plugin

    @property
    def deepspeed_plugin(self) -> DeepSpeedSettings | None:
        """The DeepSpeed settings of a DeepSpeed run (its ``deepspeed_config``, ``zero_stage``); ``None`` otherwise.

        Accelerate's scripts test ``state.deepspeed_plugin is not None`` to take DeepSpeed's paths. In
        drivetrain DeepSpeed is chosen by the strategy (``strategy="deepspeed_stage_2"``), so this is a
        read-only view of that strategy's settings, not a plugin to configure.
        """
        from drivetrain.utils.configuration import DistributedType

        if distributed_type_of(self._owner.strategy, self._owner.device) != DistributedType.DEEPSPEED:
            return None
        return DeepSpeedSettings(self._owner.strategy)

    def __repr__(self) -> str:
        return super().__repr__() + f"Mixed precision type: {self.mixed_precision}\n"
