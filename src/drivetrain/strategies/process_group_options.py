"""How a parallel strategy's processes start and join their process group: one object, checked once.

Every parallel strategy (DDP, FSDP, DeepSpeed, model parallel, a user's) takes the same keyword
arguments for this (:class:`ProcessGroupArguments`) and passes them on unchanged; the base class
turns them into one :class:`ProcessGroupOptions`, which is where they are validated and what the
strategy reads afterwards (``strategy.process_group_options``).
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Mapping
from typing import Any, TypedDict

from drivetrain.strategies.collective_monitor import STALL_TIMEOUT
from drivetrain.strategies.process_group import as_timedelta

DEFAULT_TIMEOUT = datetime.timedelta(minutes=30)

#: How a job's processes are started when drivetrain starts them.
START_METHODS = ("popen", "spawn", "fork", "forkserver")


class ProcessGroupArguments(TypedDict, total=False):
    """The keyword arguments every parallel strategy takes for its processes and their group.

    Attributes:
        num_nodes: how many nodes the job spans.
        start_method: ``"popen"`` re-runs the script once per extra local rank (the default, as
            torchrun would); ``"spawn"``, ``"fork"`` and ``"forkserver"`` start processes with
            ``torch.multiprocessing`` and run a function in each.
        process_group_backend: ``"gloo"``, ``"nccl"`` … (default: the device's usual one).
        timeout: how long collectives and the rendezvous wait (a ``timedelta`` or seconds).
        stall_timeout: seconds after which a collective that waits for ranks which are elsewhere
            ends with an error naming them (``None``: no limit).
        debug_collectives: before every collective, check through the rendezvous store that all
            ranks entered the same one with the same shapes (slow; for debugging mismatches).
    """

    num_nodes: int
    start_method: str
    process_group_backend: str | None
    timeout: datetime.timedelta | float
    stall_timeout: float | None
    debug_collectives: bool


@dataclasses.dataclass(frozen=True)
class ProcessGroupOptions:
    """:class:`ProcessGroupArguments`, checked and normalised (``timeout`` as a ``timedelta``)."""

    num_nodes: int = 1
    start_method: str = "popen"
    process_group_backend: str | None = None
    timeout: datetime.timedelta = DEFAULT_TIMEOUT
    stall_timeout: float | None = STALL_TIMEOUT
    debug_collectives: bool = False

    def __post_init__(self) -> None:
        num_nodes, stall = self.num_nodes, self.stall_timeout
        if isinstance(num_nodes, bool) or not isinstance(num_nodes, int) or num_nodes < 1:
            raise ValueError(f"num_nodes must be an int >= 1, got {num_nodes!r}.")
        if self.start_method not in START_METHODS:
            raise ValueError(
                f"start_method={self.start_method!r} is not supported; use one of {', '.join(START_METHODS)}."
            )
        backend = self.process_group_backend
        if backend is not None and not isinstance(backend, str):
            raise TypeError(
                f"process_group_backend expects a name such as 'gloo' or 'nccl', got {backend!r}."
            )
        if stall is not None and (
            isinstance(stall, bool) or not isinstance(stall, (int, float)) or stall <= 0
        ):
            raise ValueError(
                f"stall_timeout must be a positive number of seconds, or None for no limit, got {stall!r}."
            )
        if not isinstance(self.debug_collectives, bool):
            raise TypeError(f"debug_collectives must be True or False, got {self.debug_collectives!r}.")
        object.__setattr__(self, "timeout", as_timedelta(self.timeout))

    @classmethod
    def from_arguments(cls, owner: str, arguments: Mapping[str, Any]) -> ProcessGroupOptions:
        """The options ``arguments`` give; a name that is not one of them is an error naming ``owner``."""
        unknown = sorted(set(arguments) - set(ProcessGroupArguments.__annotations__))
        if unknown:
            raise TypeError(
                f"{owner} got unexpected keyword argument(s) {', '.join(map(repr, unknown))}. Besides its own, it "
                f"takes the process-group settings {', '.join(ProcessGroupArguments.__annotations__)}."
            )
        return cls(**arguments)

    def as_arguments(self) -> ProcessGroupArguments:
        """The keyword arguments that give these options to another strategy."""
        return ProcessGroupArguments(**dataclasses.asdict(self))  # type: ignore[typeddict-item]


def split_process_group_arguments(arguments: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``arguments`` as (the process-group settings among them, everything else)."""
    names = ProcessGroupArguments.__annotations__
    return (
        {k: v for k, v in arguments.items() if k in names},
        {k: v for k, v in arguments.items() if k not in names},
    )
