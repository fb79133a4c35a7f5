"""Which environment detect_cluster_environment() picks, and in which order."""

from __future__ import annotations

import pytest

import drivetrain.plugins.environments as environments
from drivetrain.plugins.environments import (
    ClusterEnvironment,
    KubeflowEnvironment,
    LocalEnvironment,
    LSFEnvironment,
    MPIEnvironment,
    SLURMEnvironment,
    TorchElasticEnvironment,
    detect_cluster_environment,
)

TORCHRUN = {
    "TORCHELASTIC_RUN_ID": "run-1",
    "RANK": 1,
    "LOCAL_RANK": 1,
    "WORLD_SIZE": 4,
    "GROUP_RANK": 0,
    "LOCAL_WORLD_SIZE": 2,
    "MASTER_ADDR": "node1",
    "MASTER_PORT": 29500,
}
SRUN = {
    "SLURM_NTASKS": 4,
    "SLURM_PROCID": 1,
    "SLURM_LOCALID": 1,
    "SLURM_NODEID": 0,
    "SLURM_NNODES": 2,
    "SLURM_JOB_NODELIST": "node[1-2]",
    "SLURM_JOB_ID": 1234,
    "SLURM_JOB_NAME": "train",
}
KUBEFLOW = {
    "KUBERNETES_PORT": "tcp://10.0.0.1:443",
    "MASTER_ADDR": "job-master-0",
    "MASTER_PORT": 23456,
    "WORLD_SIZE": 3,
    "RANK": 2,
}
JSRUN = {
    "LSB_JOBID": 777,
    "LSB_MCPU_HOSTS": "batch1 1 h01n01 42 h01n02 42",
    "JSM_NAMESPACE_SIZE": 12,
    "JSM_NAMESPACE_RANK": 7,
    "JSM_NAMESPACE_LOCAL_RANK": 1,
    # Spectrum MPI is Open MPI: jsrun's processes carry Open MPI's variables as well.
    "OMPI_COMM_WORLD_SIZE": 12,
    "OMPI_COMM_WORLD_RANK": 7,
}
OPEN_MPI = {"OMPI_COMM_WORLD_SIZE": 2, "OMPI_COMM_WORLD_RANK": 1, "OMPI_COMM_WORLD_LOCAL_RANK": 1}
HYDRA = {"PMI_SIZE": 2, "PMI_RANK": 0, "MPI_LOCALRANKID": 0}
DRIVETRAIN_CHILD = {
    "LOCAL_RANK": 1,
    "RANK": 1,
    "NODE_RANK": 0,
    "WORLD_SIZE": 2,
    "LOCAL_WORLD_SIZE": 2,
    "MASTER_ADDR": "127.0.0.1",
    "MASTER_PORT": 40000,
}


@pytest.mark.parametrize(
    ("variables", "expected"),
    [
        ({}, LocalEnvironment),
        (TORCHRUN, TorchElasticEnvironment),
        ({**SRUN, **TORCHRUN}, TorchElasticEnvironment),
        ({**KUBEFLOW, **TORCHRUN}, TorchElasticEnvironment),
        (SRUN, SLURMEnvironment),
        ({**SRUN, **HYDRA}, SLURMEnvironment),  # srun --mpi=pmi2 also sets PMI_*
        ({**SRUN, "SLURM_JOB_NAME": "bash"}, LocalEnvironment),
        ({**SRUN, "SLURM_JOB_NAME": "interactive"}, LocalEnvironment),
        (KUBEFLOW, KubeflowEnvironment),
        # drivetrain's own launcher inside a pod: the child has LOCAL_RANK, so it is not Kubeflow's.
        ({**KUBEFLOW, **DRIVETRAIN_CHILD}, LocalEnvironment),
        (JSRUN, LSFEnvironment),
        (OPEN_MPI, MPIEnvironment),
        (HYDRA, MPIEnvironment),
        (DRIVETRAIN_CHILD, LocalEnvironment),
    ],
    ids=[
        "nothing",
        "torchrun",
        "torchrun-in-slurm",
        "torchrun-in-kubeflow",
        "srun",
        "srun-with-pmi",
        "slurm-bash",
        "slurm-interactive",
        "kubeflow",
        "drivetrain-child-in-pod",
        "jsrun",
        "open-mpi",
        "hydra",
        "drivetrain-child",
    ],
)
def test_detect_cluster_environment_picks_the_first_match(setenv, variables, expected):
    setenv(**variables)
    environment = detect_cluster_environment()
    assert type(environment) is expected


@pytest.mark.parametrize(
    ("environment_class", "required"),
    [
        (TorchElasticEnvironment, {"TORCHELASTIC_RUN_ID": "x"}),
        (SLURMEnvironment, {"SLURM_NTASKS": 2}),
        (KubeflowEnvironment, KUBEFLOW),
        (LSFEnvironment, {k: v for k, v in JSRUN.items() if not k.startswith("OMPI_")}),
        (MPIEnvironment, {"OMPI_COMM_WORLD_SIZE": 2, "OMPI_COMM_WORLD_RANK": 0}),
    ],
)
def test_each_environment_needs_all_of_its_variables(setenv, monkeypatch, environment_class, required):
    assert not environment_class.detect()
    setenv(**required)
    assert environment_class.detect()
    for name in required:
        with monkeypatch.context() as patch:
            patch.delenv(name)
            if environment_class is LSFEnvironment and name == "LSB_MCPU_HOSTS":
                # Either host source is enough; drop the other one too.
                patch.delenv("LSB_DJOB_RANKFILE", raising=False)
            assert not environment_class.detect(), f"{environment_class.__name__} detected without {name}"


def test_lsf_detects_with_a_rankfile_instead_of_mcpu_hosts(setenv, monkeypatch, tmp_path):
    setenv(**{k: v for k, v in JSRUN.items() if k != "LSB_MCPU_HOSTS"})
    assert not LSFEnvironment.detect()
    rankfile = tmp_path / "rankfile"
    rankfile.write_text("batch1\nh01n01\n")
    monkeypatch.setenv("LSB_DJOB_RANKFILE", str(rankfile))
    assert LSFEnvironment.detect()


def test_local_always_detects():
    assert LocalEnvironment.detect()


def test_package_exports():
    assert set(environments.__all__) == {
        "ClusterEnvironment",
        "KubeflowEnvironment",
        "LSFEnvironment",
        "LocalEnvironment",
        "MPIEnvironment",
        "SLURMEnvironment",
        "TorchElasticEnvironment",
        "detect_cluster_environment",
    }
    for name in environments.__all__:
        exported = getattr(environments, name)
        if isinstance(exported, type) and exported is not ClusterEnvironment:
            assert issubclass(exported, ClusterEnvironment)
            exported()  # concrete: every abstract method is implemented
