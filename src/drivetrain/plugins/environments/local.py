"""The default environment: a laptop, a workstation, or a single machine no scheduler manages.

It is also what the children of drivetrain's own "re-run the script" launcher see: the launcher
starts each extra local rank with torchrun's variables (``LOCAL_RANK``, ``RANK``, ``NODE_RANK``,
``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``) but without
``TORCHELASTIC_RUN_ID``, so a child reads its place in the job from those variables while the
parent, which has none of them, is told its world size and rank through the setters.
"""

from __future__ import annotations

from drivetrain.plugins.environments import _environ as env
from drivetrain.plugins.environments.cluster_environment import ClusterEnvironment


class LocalEnvironment(ClusterEnvironment):
    """A single free machine (or a set of machines a user launches by hand).

    ``main_port`` is ``0`` until it is known: the launcher binds its rendezvous store on port 0,
    lets the operating system choose a free port, and reports it through :meth:`set_main_port`.
    Ports are never chosen by probing, which races with other processes.
    """

    def __init__(self) -> None:
        self._world_size = 1
        self._global_rank = 0
        self._main_port: int | None = None

    @property
    def creates_processes_externally(self) -> bool:
        """True when ``LOCAL_RANK`` is set: this process is a launched child, or the user launched it."""
        return env.is_set("LOCAL_RANK")

    @property
    def main_address(self) -> str:
        """``MASTER_ADDR``, or the loopback address for a single machine."""
        return env.get_str("MASTER_ADDR") or "127.0.0.1"

    @property
    def main_port(self) -> int:
        """``MASTER_PORT``, else the port given to :meth:`set_main_port`, else ``0`` (not chosen yet)."""
        port = env.get_port("MASTER_PORT")
        if port is not None:
            return port
        return self._main_port if self._main_port is not None else 0

    def set_main_port(self, port: int) -> None:
        """Record the port the launcher's rendezvous store actually bound.

        Raises:
            ValueError: ``port`` is not a valid TCP port, or ``MASTER_PORT`` already fixes a different one.
        """
        if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
            raise ValueError(f"set_main_port expects a TCP port between 1 and 65535, got {port!r}.")
        fixed = env.get_port("MASTER_PORT")
        if fixed is not None and fixed != port:
            raise ValueError(
                f"Cannot set the main port to {port}: MASTER_PORT={fixed} is set in the environment and "
                "wins. Unset MASTER_PORT to let the launcher choose a free port."
            )
        self._main_port = port

    @property
    def uses_agent_store(self) -> bool:
        """``TORCHELASTIC_USE_AGENT_STORE=True``: the process that started this one already hosts the
        rendezvous store on ``MASTER_PORT`` (``notebook_launcher``), so rank 0 joins it like the others."""
        return env.get_str("TORCHELASTIC_USE_AGENT_STORE") == "True"

    @staticmethod
    def detect() -> bool:
        """Always true: this is the fallback when no cluster is detected."""
        return True

    def world_size(self) -> int:
        """``WORLD_SIZE`` when set, else the value given to :meth:`set_world_size` (default 1)."""
        size = env.get_int("WORLD_SIZE", minimum=1)
        return self._world_size if size is None else size

    def set_world_size(self, size: int) -> None:
        """Record the world size; it must agree with ``WORLD_SIZE`` when that is set."""
        env.check_world_size_arg(size)
        if env.is_set("WORLD_SIZE"):
            env.check_fixed(
                "world size",
                size,
                self.world_size(),
                source=f"WORLD_SIZE={self.world_size()}",
                fix="Unset WORLD_SIZE or launch that many processes.",
            )
        self._world_size = size

    def global_rank(self) -> int:
        """``RANK`` when set, else the value given to :meth:`set_global_rank` (default 0)."""
        rank = env.get_int("RANK")
        return self._global_rank if rank is None else rank

    def set_global_rank(self, rank: int) -> None:
        """Record this process's rank; it must agree with ``RANK`` when that is set."""
        env.check_rank_arg(rank)
        if env.is_set("RANK"):
            env.check_fixed(
                "global rank",
                rank,
                self.global_rank(),
                source=f"RANK={self.global_rank()}",
                fix="Unset RANK, or set it to the rank this process should have.",
            )
        self._global_rank = rank

    def local_rank(self) -> int:
        """``LOCAL_RANK``, or 0."""
        rank = env.get_int("LOCAL_RANK")
        return 0 if rank is None else rank

    def node_rank(self) -> int:
        """``NODE_RANK``, else ``GROUP_RANK``, else 0."""
        for name in ("NODE_RANK", "GROUP_RANK"):
            rank = env.get_int(name)
            if rank is not None:
                return rank
        return 0

    def processes_per_node(self) -> int | None:
        return env.get_int("LOCAL_WORLD_SIZE", minimum=1)

    def validate_settings(self, num_devices: int, num_nodes: int) -> None:
        """Check the trainer's ``devices``/``num_nodes`` against what a launcher announced.

        Raises:
            ValueError: ``LOCAL_RANK`` is set without ``WORLD_SIZE`` (a leftover), or is not below
                ``num_devices``; ``LOCAL_WORLD_SIZE`` differs from ``num_devices``; ``WORLD_SIZE`` is
                not the number of processes the settings make.
        """
        local = env.get_int("LOCAL_RANK")
        total = env.get_int("WORLD_SIZE", minimum=1)
        if local is not None:
            if total is None and (local > 0 or num_devices * num_nodes > 1):
                raise ValueError(
                    f"LOCAL_RANK={local} is set, so this process looks started by a launcher, but WORLD_SIZE is not "
                    f"(a launcher sets both): probably a leftover from another job, which would make this a job of one "
                    f"process instead of devices={num_devices}. Unset LOCAL_RANK, or start the job with "
                    f"`drivetrain launch` or torchrun."
                )
            if local >= num_devices:
                raise ValueError(
                    f"LOCAL_RANK={local} is out of range for devices={num_devices} (one process per device, local "
                    f"ranks 0 to {num_devices - 1}). Start as many processes per node as devices, or pass devices= "
                    f"to match the launcher."
                )
        per_node = env.get_int("LOCAL_WORLD_SIZE", minimum=1)
        if per_node is None:
            if local is not None and total is not None and total != num_devices * num_nodes:
                raise ValueError(
                    f"WORLD_SIZE={total} but devices={num_devices} and num_nodes={num_nodes} make "
                    f"{num_devices * num_nodes} processes. Pass devices and num_nodes that multiply to WORLD_SIZE "
                    f"(or devices='auto'), or start that many processes."
                )
            return
        if per_node != num_devices:
            raise ValueError(
                f"The launcher started {per_node} processes per node (LOCAL_WORLD_SIZE={per_node}) but "
                f"devices={num_devices}. Pass devices={per_node}, or relaunch with {num_devices} processes "
                "per node."
            )
        if total is None or total == per_node * num_nodes:
            return
        if total % per_node:
            raise ValueError(
                f"WORLD_SIZE={total} is not a multiple of LOCAL_WORLD_SIZE={per_node}; every node must run "
                "the same number of processes. Fix the variables your launcher sets."
            )
        raise ValueError(
            f"The launcher started {total} processes in all (WORLD_SIZE={total}), {per_node} per node, i.e. "
            f"on {total // per_node} node(s), but num_nodes={num_nodes}. Pass num_nodes={total // per_node}, "
            f"or relaunch on {num_nodes} node(s)."
        )

    def __repr__(self) -> str:
        return env.environment_repr(
            self, main_address=lambda: self.main_address, main_port=lambda: self.main_port
        )
