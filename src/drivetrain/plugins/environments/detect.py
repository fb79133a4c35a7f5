"""Pick the cluster environment this process runs under."""

from __future__ import annotations

from drivetrain.plugins.environments.cluster_environment import ClusterEnvironment
from drivetrain.plugins.environments.kubeflow import KubeflowEnvironment
from drivetrain.plugins.environments.local import LocalEnvironment
from drivetrain.plugins.environments.lsf import LSFEnvironment
from drivetrain.plugins.environments.mpi import MPIEnvironment
from drivetrain.plugins.environments.slurm import SLURMEnvironment
from drivetrain.plugins.environments.torchelastic import TorchElasticEnvironment

# Most specific first. torchrun leads because it may run inside a SLURM allocation or a
# Kubeflow pod, whose variables are then also present; LSF precedes MPI because jsrun's
# processes also carry Open MPI's variables (Spectrum MPI is built on Open MPI).
DETECTION_ORDER: tuple[type[ClusterEnvironment], ...] = (
    TorchElasticEnvironment,
    SLURMEnvironment,
    KubeflowEnvironment,
    LSFEnvironment,
    MPIEnvironment,
    LocalEnvironment,
)


def detect_cluster_environment() -> ClusterEnvironment:
    """A new instance of the first environment in :data:`DETECTION_ORDER` that detects itself.

    :class:`LocalEnvironment` always detects, so something is always returned.
    """
    for environment_class in DETECTION_ORDER:
        if environment_class.detect():
            return environment_class()
    raise AssertionError("LocalEnvironment.detect() is always true")  # pragma: no cover
