"""Pods started by Kubeflow's training operator for a ``PyTorchJob``.

The operator runs one process per pod and sets ``MASTER_ADDR`` (the master pod's service),
``MASTER_PORT``, ``WORLD_SIZE`` (the number of pods) and ``RANK`` (this pod's index); Kubernetes
itself sets ``KUBERNETES_PORT`` in every pod. A pod that runs ``torchrun`` (an elastic
PyTorchJob) or drivetrain's own launcher also has ``LOCAL_RANK`` and is handled by
:class:`TorchElasticEnvironment` or :class:`LocalEnvironment` instead.
"""

from __future__ import annotations

from drivetrain.plugins.environments import _environ as env
from drivetrain.plugins.environments.launched import LaunchedEnvironment, LayoutVariables

_WHO = "KubeflowEnvironment"
_REQUIRED = ("KUBERNETES_PORT", "MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK")
# Per-node launchers (torchrun, drivetrain's own) set these; the operator never does.
_EXCLUDED = ("LOCAL_RANK", "GROUP_RANK", "LOCAL_WORLD_SIZE")


class KubeflowEnvironment(LaunchedEnvironment):
    """One process per pod of a Kubeflow ``PyTorchJob``: each pod is a node of one process."""

    who = _WHO

    @property
    def main_address(self) -> str:
        """``MASTER_ADDR`` (the master replica's service name)."""
        return env.require_str("MASTER_ADDR", who=_WHO)

    @property
    def main_port(self) -> int:
        """``MASTER_PORT``."""
        return env.require_int("MASTER_PORT", who=_WHO, minimum=1, maximum=65535)

    @staticmethod
    def detect() -> bool:
        """True in a PyTorchJob pod whose process no per-node launcher started."""
        return all(env.is_set(name) for name in _REQUIRED) and not any(env.is_set(name) for name in _EXCLUDED)

    def layout_variables(self) -> LayoutVariables:
        return LayoutVariables(
            world_size="WORLD_SIZE",
            global_rank="RANK",
            local_rank=None,  # one process per pod
            set_by=", set by the PyTorchJob operator",
            world_size_fix="Change the job's replica counts instead.",
            rank_fix="Ranks in a PyTorchJob are assigned by the operator; do not set them.",
        )

    def node_rank(self) -> int:
        """``RANK``: each pod counts as one node."""
        return self.global_rank()

    def processes_per_node(self) -> int | None:
        return 1  # a PyTorchJob runs one process per pod

    def validate_settings(self, num_devices: int, num_nodes: int) -> None:
        """Check ``devices == 1`` and ``num_nodes == WORLD_SIZE``.

        Raises:
            ValueError: Either disagrees with the PyTorchJob.
        """
        if num_devices != 1:
            raise ValueError(
                f"Kubeflow PyTorchJob starts one process per pod, but devices={num_devices}. Set devices=1, "
                "or run torchrun inside the pod (an elastic PyTorchJob) to use several devices per pod."
            )
        pods = self.world_size()
        if pods != num_nodes:
            raise ValueError(
                f"The PyTorchJob runs {pods} pod(s) (WORLD_SIZE={pods}) but num_nodes={num_nodes}. Pass "
                f"num_nodes={pods}, or change the job's Master + Worker replica counts to {num_nodes}."
            )

    def __repr__(self) -> str:
        return env.environment_repr(
            self, main_address=lambda: self.main_address, main_port=lambda: self.main_port
        )
