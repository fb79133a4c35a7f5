"""Where ranks, world size and the rendezvous address come from."""

from __future__ import annotations

from abc import ABC, abstractmethod


class ClusterEnvironment(ABC):
    """The facts a cluster (or a launcher) gives each process about the job it belongs to.

    Environment variables are read here and in the launchers only; the rest of drivetrain asks
    a ``ClusterEnvironment``.
    """

    @property
    @abstractmethod
    def creates_processes_externally(self) -> bool:
        """True when something outside drivetrain (torchrun, srun, mpirun …) started the processes."""

    @property
    @abstractmethod
    def main_address(self) -> str:
        """The host of global rank 0, where the rendezvous store listens."""

    @property
    @abstractmethod
    def main_port(self) -> int:
        """The port of the rendezvous store on :attr:`main_address`."""

    @staticmethod
    @abstractmethod
    def detect() -> bool:
        """Whether this process runs under this kind of cluster."""

    @abstractmethod
    def world_size(self) -> int:
        """The total number of processes in the job."""

    @abstractmethod
    def set_world_size(self, size: int) -> None:
        """Tell the environment the world size (only meaningful where drivetrain launches)."""

    @abstractmethod
    def global_rank(self) -> int:
        """This process's rank among all processes."""

    @abstractmethod
    def set_global_rank(self, rank: int) -> None:
        """Tell the environment this process's rank (only meaningful where drivetrain launches)."""

    @abstractmethod
    def local_rank(self) -> int:
        """This process's rank among the processes on its node."""

    @abstractmethod
    def node_rank(self) -> int:
        """The rank of this process's node."""

    def processes_per_node(self) -> int | None:
        """How many processes the launcher started on each node, when it says (``None`` otherwise).

        ``devices="auto"`` under an external launcher means this many.
        """
        return None

    def validate_settings(self, num_devices: int, num_nodes: int) -> None:
        """Raise ``ValueError`` (saying what to change) if the trainer's settings contradict the cluster."""

    def teardown(self) -> None:
        """Undo what the environment changed in this process."""

    @property
    def requeue_signal(self) -> int | None:
        """The signal on which a run saves, has the job requeued (:meth:`requeue`) and exits; ``None``: none."""
        return None

    def requeue(self) -> None:
        """Put this job back in the cluster's queue (called on global rank 0 after the checkpoint is saved)."""

    def rendezvous_namespace(self) -> str:
        """A key prefix that tells apart the rendezvous of successive attempts of one job (elastic restarts)."""
        return ""

    @property
    def launcher_pid(self) -> int | None:
        """The launcher process this one must not outlive (its parent), where one waits for it.

        A rank started by a launcher that is then killed (``kill -9``) would train on as an
        orphan; parallel strategies make ranks die with this process. ``None`` where the
        cluster's own agent manages the processes' lifetime (SLURM, MPI) or no launcher waits.
        """
        return None

    @property
    def error_file(self) -> str | None:
        """Where the launcher wants a failing process to describe its error (torchrun's error file), if anywhere."""
        return None

    @property
    def uses_agent_store(self) -> bool:
        """Whether ranks rendezvous through a store the launcher's agent already runs (torchrun)."""
        return False

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"
