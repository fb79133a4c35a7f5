"""The base of environments whose launcher fixed the job's layout in environment variables.

torchrun, SLURM's srun, jsrun (LSF), mpirun and the Kubeflow operator start every process
themselves and announce its world size and ranks in variables. Reading those variables, and
refusing to "set" a different layout (which drivetrain does only where it launches), is the same
for all of them; each subclass names its variables and says how to change the layout.
"""

from __future__ import annotations

import dataclasses
from abc import abstractmethod
from typing import ClassVar

from drivetrain.plugins.environments import _environ as env
from drivetrain.plugins.environments.cluster_environment import ClusterEnvironment


@dataclasses.dataclass(frozen=True)
class LayoutVariables:
    """Where a launcher announces the layout, and what to tell a user who asks for another one.

    Attributes:
        world_size: the variable holding the number of processes.
        global_rank: the variable holding this process's rank.
        local_rank: the variable holding its rank on the node (``None``: one process per node).
        set_by: who sets them, for messages (``", set by torchrun"``; empty to say nothing).
        world_size_fix: how to get another world size (``{size}`` stands for the one asked for).
        rank_fix: what to do instead of setting ranks.
    """

    world_size: str
    global_rank: str
    local_rank: str | None
    set_by: str
    world_size_fix: str
    rank_fix: str


class LaunchedEnvironment(ClusterEnvironment):
    """A cluster environment whose launcher started the processes and fixed their layout."""

    #: The environment's name in messages.
    who: ClassVar[str] = ""

    @abstractmethod
    def layout_variables(self) -> LayoutVariables:
        """Where this launcher announces the world size and ranks."""

    @property
    def creates_processes_externally(self) -> bool:
        """Always true: the launcher started the processes."""
        return True

    def world_size(self) -> int:
        return env.require_int(self.layout_variables().world_size, who=self.who, minimum=1)

    def set_world_size(self, size: int) -> None:
        """Accept ``size`` only if it equals the launcher's; otherwise ``ValueError`` saying how to change it."""
        env.check_world_size_arg(size)
        names, actual = self.layout_variables(), self.world_size()
        env.check_fixed(
            "world size",
            size,
            actual,
            source=f"{names.world_size}={actual}{names.set_by}",
            fix=names.world_size_fix.format(size=size),
        )

    def global_rank(self) -> int:
        return env.require_int(self.layout_variables().global_rank, who=self.who)

    def set_global_rank(self, rank: int) -> None:
        """Accept ``rank`` only if it equals the launcher's; otherwise ``ValueError``."""
        env.check_rank_arg(rank)
        names, actual = self.layout_variables(), self.global_rank()
        env.check_fixed(
            "global rank",
            rank,
            actual,
            source=f"{names.global_rank}={actual}{names.set_by}",
            fix=names.rank_fix,
        )

    def local_rank(self) -> int:
        variable = self.layout_variables().local_rank
        return 0 if variable is None else env.require_int(variable, who=self.who)
