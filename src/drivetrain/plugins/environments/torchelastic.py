"""Processes started by ``torchrun`` (``python -m torch.distributed.run``).

torchrun's agent gives every worker ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``GROUP_RANK``
(the node's rank), ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``,
``TORCHELASTIC_RUN_ID`` and ``TORCHELASTIC_USE_AGENT_STORE``. ``TORCHELASTIC_RUN_ID`` is the one
variable only torchrun sets, so it is what detection keys on — which is why torchrun wins even
inside a SLURM or Kubeflow allocation.

Example::

    torchrun --standalone --nproc-per-node=2 train.py
"""

from __future__ import annotations

from drivetrain.plugins.environments import _environ as env
from drivetrain.plugins.environments.launched import LaunchedEnvironment, LayoutVariables

_WHO = "TorchElasticEnvironment (torchrun)"


class TorchElasticEnvironment(LaunchedEnvironment):
    """Reads the job layout torchrun announced; nothing here can change it."""

    who = _WHO

    @property
    def main_address(self) -> str:
        """``MASTER_ADDR``."""
        return env.require_str("MASTER_ADDR", who=_WHO)

    @property
    def main_port(self) -> int:
        """``MASTER_PORT``.

        Raises:
            ValueError: It is unset, garbled, or ``0`` (torchrun's static rendezvous passes
                ``--master-port=0`` unchanged to the workers, who then cannot reach the store).
        """
        if env.get_str("MASTER_PORT") == "0":
            raise ValueError(
                "torchrun set MASTER_PORT=0: with the static rendezvous, --master-port=0 is passed to the "
                "workers unchanged and no process can connect to it. Use `torchrun --standalone` on one "
                "node, or give a real port (--master-port=29500) or --rdzv-backend=c10d "
                "--rdzv-endpoint=HOST:PORT."
            )
        return env.require_int("MASTER_PORT", who=_WHO, minimum=1, maximum=65535)

    @property
    def uses_agent_store(self) -> bool:
        """Whether torchrun's agent already runs the TCP store on ``MASTER_PORT`` (ranks only connect)."""
        return env.get_str("TORCHELASTIC_USE_AGENT_STORE") == "True"

    @property
    def launcher_pid(self) -> int | None:
        """torchrun's agent, which started this process: ``DRIVETRAIN_LAUNCHER_PID`` (set by
        ``drivetrain launch``), else the parent this process had when drivetrain was imported.

        Not the parent now: an agent killed while its ranks start has been replaced by init by the
        time a rank asks, and the orphan would wait for a rendezvous that never comes.
        """
        given = env.get_int("DRIVETRAIN_LAUNCHER_PID", minimum=1)
        return given if given is not None else env.parent_at_start()

    @property
    def error_file(self) -> str | None:
        """``TORCHELASTIC_ERROR_FILE``: torchrun reads a failed worker's error from there."""
        return env.get_str("TORCHELASTIC_ERROR_FILE") or None

    def rendezvous_namespace(self) -> str:
        """The restart attempt: the agent's store outlives restarts, so each attempt needs its own keys."""
        return f"attempt{env.get_str('TORCHELASTIC_RESTART_COUNT') or 0}"

    @staticmethod
    def detect() -> bool:
        """True under torchrun (``TORCHELASTIC_RUN_ID`` is set)."""
        return env.is_set("TORCHELASTIC_RUN_ID")

    def layout_variables(self) -> LayoutVariables:
        return LayoutVariables(
            world_size="WORLD_SIZE",
            global_rank="RANK",
            local_rank="LOCAL_RANK",
            set_by=", set by torchrun",
            world_size_fix="Relaunch torchrun with --nnodes and --nproc-per-node that multiply to it.",
            rank_fix="Ranks under torchrun are assigned by torchrun; do not set them.",
        )

    def node_rank(self) -> int:
        """``GROUP_RANK`` (torchrun's name for the node's rank)."""
        return env.require_int("GROUP_RANK", who=_WHO)

    def processes_per_node(self) -> int | None:
        return env.require_int("LOCAL_WORLD_SIZE", who=_WHO, minimum=1)

    def validate_settings(self, num_devices: int, num_nodes: int) -> None:
        """Check ``devices`` against ``LOCAL_WORLD_SIZE`` and ``num_nodes`` against the node count.

        Raises:
            ValueError: Either disagrees with what torchrun started.
        """
        per_node = env.require_int("LOCAL_WORLD_SIZE", who=_WHO, minimum=1)
        if per_node != num_devices:
            raise ValueError(
                f"torchrun started {per_node} processes per node (--nproc-per-node={per_node}) but "
                f"devices={num_devices}; pass devices={per_node} (or devices='auto'), or relaunch with "
                f"--nproc-per-node={num_devices}."
            )
        total = self.world_size()
        nodes, remainder = divmod(total, per_node)
        if remainder:
            raise ValueError(
                f"torchrun set WORLD_SIZE={total}, which is not a multiple of LOCAL_WORLD_SIZE={per_node}; "
                "every node must run the same --nproc-per-node."
            )
        if nodes != num_nodes:
            raise ValueError(
                f"torchrun started {nodes} node(s) (WORLD_SIZE={total} / --nproc-per-node={per_node}) but "
                f"num_nodes={num_nodes}; pass num_nodes={nodes}, or relaunch with --nnodes={num_nodes}."
            )

    def __repr__(self) -> str:
        return env.environment_repr(
            self,
            main_address=lambda: self.main_address,
            main_port=lambda: self.main_port,
            uses_agent_store=lambda: self.uses_agent_store,
        )
