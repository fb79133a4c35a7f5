"""The cluster environment's contract: under a job's variables, each process learns its place in the job.

The kit acts as the scheduler: for every rank of a job of ``world_size`` processes on one node it
sets the variables the environment reads (``env``, whose values may say ``{rank}``,
``{local_rank}``, ``{node_rank}``, ``{world_size}`` and ``{port}``), builds the environment and
asks it. The same variables start the kit's programs when the environment says the processes are
created outside drivetrain.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from drivetrain.plugins import ClusterEnvironment
from drivetrain.testing.contracts import Check, NotApplicable

#: The placeholders ``env``'s values may use.
PLACEHOLDERS = ("rank", "local_rank", "node_rank", "world_size", "port")


def rank_variables(env: Mapping[str, str], world_size: int, port: int) -> list[dict[str, str]]:
    """The variables of each rank of a one-node job: ``env`` with its placeholders filled in.

    Raises:
        ValueError: ``world_size`` below 1, or a value with a placeholder the kit does not fill.
    """
    if not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be a whole number of processes, at least 1; got {world_size!r}.")
    filled = []
    for rank in range(world_size):
        values = {"rank": rank, "local_rank": rank, "node_rank": 0, "world_size": world_size, "port": port}
        ranks: dict[str, str] = {}
        for name, value in env.items():
            try:
                ranks[name] = str(value).format(**values)
            except (KeyError, IndexError, ValueError) as error:
                raise ValueError(
                    f"The variable {name}={value!r} has a placeholder the kit does not fill ({error}); use "
                    f"{', '.join('{' + p + '}' for p in PLACEHOLDERS)}, and write a literal brace as {{{{ or }}}}."
                ) from None
        filled.append(ranks)
    return filled


@contextmanager
def variables(values: Mapping[str, str]) -> Iterator[None]:
    """``os.environ`` with ``values`` set (and put back afterwards)."""
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def environment_checks(cls: Any, make: Callable[[], Any], ranks: list[dict[str, str]]) -> list[Check]:
    """The checks for cluster environment class ``cls`` in a job whose ranks have the variables ``ranks``."""
    world = len(ranks)

    def subclass() -> str | None:
        if not (isinstance(cls, type) and issubclass(cls, ClusterEnvironment)):
            return f"{cls!r} is not a subclass of drivetrain.plugins.ClusterEnvironment"
        return None

    def detected() -> str | None:
        for rank, values in enumerate(ranks):
            with variables(values):
                if cls.detect() is not True:
                    return f"detect() returned {cls.detect()!r} for rank {rank} under the job's variables ({_shown(values)})"
        return None

    def places() -> str | None:
        seen: dict[tuple[int, int], int] = {}
        for rank, values in enumerate(ranks):
            with variables(values):
                environment = make()
                size, global_rank = environment.world_size(), environment.global_rank()
                local, node = environment.local_rank(), environment.node_rank()
            if size != world:
                return f"world_size() returned {size!r} in a job of {world} processes (rank {rank}, {_shown(values)})"
            if global_rank != rank:
                return f"the process started as rank {rank} learnt global_rank()={global_rank!r} ({_shown(values)})"
            if (local, node) in seen:
                return f"ranks {seen[(local, node)]} and {rank} both learnt local_rank()={local}, node_rank()={node}"
            if not (0 <= local < world and 0 <= node < world):
                return f"rank {rank} learnt local_rank()={local!r}, node_rank()={node!r}, impossible in a job of {world}"
            seen[(local, node)] = rank
        return None

    def rendezvous() -> str | None:
        with variables(ranks[0]):
            environment = make()
            address, port, external = (
                environment.main_address,
                environment.main_port,
                environment.creates_processes_externally,
            )
        if not isinstance(external, bool):
            return f"creates_processes_externally is {external!r}, not True or False"
        if not isinstance(address, str) or not address:
            return f"main_address is {address!r}; it must be rank 0's host name or address"
        if (
            isinstance(port, bool)
            or not isinstance(port, int)
            or (external and world > 1 and not 0 < port < 65536)
        ):
            return (
                f"main_port is {port!r}; the processes meet on rank 0's host at this port (an int 1..65535)"
            )
        return None

    def settings() -> str | NotApplicable | None:
        with variables(ranks[0]):
            environment = make()
            per_node = environment.processes_per_node() or world
            environment.validate_settings(
                per_node, max(1, world // per_node)
            )  # the job as it describes itself
            if environment.creates_processes_externally:
                return NotApplicable(
                    "the processes are created outside drivetrain: set_world_size/set_global_rank are not called"
                )
            environment.set_world_size(world)
            environment.set_global_rank(0)
        return None

    return [
        Check(
            "cluster environment: subclasses ClusterEnvironment",
            subclass,
            "subclass drivetrain.plugins.ClusterEnvironment",
            essential=True,
        ),
        Check(
            "cluster environment: detect() sees the job",
            detected,
            "return True from detect() when the scheduler's variables are set",
        ),
        Check(
            "cluster environment: each process learns its rank and the world size",
            places,
            "read world_size(), global_rank(), local_rank() and node_rank() from the scheduler's variables of each process",
            essential=True,
        ),
        Check(
            "cluster environment: where the processes meet",
            rendezvous,
            "return rank 0's address from main_address and a port from main_port (the scheduler's, or one you choose)",
        ),
        Check(
            "cluster environment: accepts the trainer's settings",
            settings,
            "raise in validate_settings() only for settings that contradict the job",
        ),
    ]


def _shown(values: Mapping[str, str]) -> str:
    return ", ".join(f"{k}={v}" for k, v in values.items())
