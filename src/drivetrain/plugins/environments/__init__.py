"""Cluster environments: where ranks, world size and the rendezvous address come from.

Each environment reads the variables one launcher or scheduler sets (torchrun, SLURM,
Kubeflow, LSF/jsrun, MPI); :func:`detect_cluster_environment` picks the one in force, falling
back to :class:`LocalEnvironment`.
"""

from drivetrain.plugins.environments.cluster_environment import ClusterEnvironment
from drivetrain.plugins.environments.detect import detect_cluster_environment
from drivetrain.plugins.environments.kubeflow import KubeflowEnvironment
from drivetrain.plugins.environments.local import LocalEnvironment
from drivetrain.plugins.environments.lsf import LSFEnvironment
from drivetrain.plugins.environments.mpi import MPIEnvironment
from drivetrain.plugins.environments.slurm import SLURMEnvironment
from drivetrain.plugins.environments.torchelastic import TorchElasticEnvironment

__all__ = [
    "ClusterEnvironment",
    "KubeflowEnvironment",
    "LSFEnvironment",
    "LocalEnvironment",
    "MPIEnvironment",
    "SLURMEnvironment",
    "TorchElasticEnvironment",
    "detect_cluster_environment",
]
