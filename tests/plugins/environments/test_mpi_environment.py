"""MPIEnvironment with Open MPI's and Hydra's variables faked (a real mpirun run is in
test_environment_launches.py). mpi4py is faked at the import boundary: absent by default, or
a stand-in module whose COMM_WORLD records the broadcast."""

from __future__ import annotations

import socket
import sys
import types

import pytest

from drivetrain.plugins.environments import MPIEnvironment
from drivetrain.plugins.environments._environ import port_from_job_id

# Rank 5 of `mpirun -n 8 --npernode 4` under Open MPI 4.
OPEN_MPI = {
    "OMPI_COMM_WORLD_SIZE": 8,
    "OMPI_COMM_WORLD_RANK": 5,
    "OMPI_COMM_WORLD_LOCAL_RANK": 1,
    "OMPI_COMM_WORLD_LOCAL_SIZE": 4,
    "OMPI_MCA_ess_base_jobid": 2086993921,
    "PMIX_NAMESPACE": 2086993921,
}
# Rank 2 of `mpiexec -n 4 -ppn 2` under MPICH / Intel MPI.
HYDRA = {"PMI_SIZE": 4, "PMI_RANK": 2, "MPI_LOCALRANKID": 0, "MPI_LOCALNRANKS": 2}


class FakeCommunicator:
    """COMM_WORLD of one rank: ``bcast`` returns rank 0's object, as MPI would."""

    def __init__(self, rank: int, from_root: object = None) -> None:
        self.rank = rank
        self.from_root = from_root
        self.broadcasts: list[object] = []

    def Get_rank(self) -> int:
        return self.rank

    def bcast(self, value: object, root: int = 0) -> object:
        assert root == 0
        self.broadcasts.append(value)
        return value if self.rank == 0 else self.from_root


@pytest.fixture(autouse=True)
def _no_mpi4py(monkeypatch):
    monkeypatch.setitem(sys.modules, "mpi4py", None)


@pytest.fixture
def fake_mpi4py(monkeypatch):
    def install(communicator: FakeCommunicator) -> None:
        package = types.ModuleType("mpi4py")
        package.MPI = types.SimpleNamespace(COMM_WORLD=communicator)
        monkeypatch.setitem(sys.modules, "mpi4py", package)

    return install


def _read(environment, name):
    """A getter's value, whether it is a method or a property."""
    value = getattr(environment, name)
    return value() if callable(value) else value


def test_open_mpi_values(setenv):
    setenv(**OPEN_MPI)
    environment = MPIEnvironment()
    assert environment.creates_processes_externally is True
    assert environment.world_size() == 8
    assert environment.global_rank() == 5
    assert environment.local_rank() == 1
    assert environment.local_size() == 4
    assert environment.node_rank() == 1


def test_hydra_values(setenv):
    setenv(**HYDRA)
    environment = MPIEnvironment()
    assert environment.world_size() == 4
    assert environment.global_rank() == 2
    assert environment.local_rank() == 0
    assert environment.local_size() == 2
    assert environment.node_rank() == 1


def test_node_rank_needs_the_local_size(setenv, monkeypatch):
    setenv(**HYDRA)
    monkeypatch.delenv("MPI_LOCALNRANKS")
    with pytest.raises(ValueError, match=r"cannot compute the node rank: MPI_LOCALNRANKS is not set"):
        MPIEnvironment().node_rank()


def test_node_rank_refuses_round_robin_placement(setenv):
    # `--map-by node`: rank 5 of 8 on 2 nodes is the third process of node 1, not the second.
    setenv(**{**OPEN_MPI, "OMPI_COMM_WORLD_LOCAL_RANK": 2})
    with pytest.raises(ValueError, match=r"rank 5 has local rank 2 of 4.*not `--map-by node`"):
        MPIEnvironment().node_rank()


def test_explicit_master_addr_and_port_win(setenv, fake_mpi4py):
    setenv(**OPEN_MPI, MASTER_ADDR="node0", MASTER_PORT=29501)
    communicator = FakeCommunicator(rank=5)
    fake_mpi4py(communicator)
    environment = MPIEnvironment()
    assert (environment.main_address, environment.main_port) == ("node0", 29501)
    assert communicator.broadcasts == []  # no collective needed


def test_single_node_without_mpi4py_uses_loopback_and_the_job_id(setenv):
    setenv(**{**OPEN_MPI, "OMPI_COMM_WORLD_SIZE": 4, "OMPI_COMM_WORLD_RANK": 1})
    environment = MPIEnvironment()
    assert environment.main_address == "127.0.0.1"
    assert environment.main_port == port_from_job_id("2086993921") == 26936


def test_pmix_namespace_is_the_job_id_when_ess_jobid_is_absent(setenv, monkeypatch):
    setenv(**{**OPEN_MPI, "OMPI_COMM_WORLD_SIZE": 4, "PMIX_NAMESPACE": "prterun-host-4242@1"})
    monkeypatch.delenv("OMPI_MCA_ess_base_jobid")
    assert MPIEnvironment().main_port == port_from_job_id("prterun-host-4242@1")


def test_no_port_source_at_all(setenv):
    setenv(**{**HYDRA, "PMI_SIZE": 2})
    environment = MPIEnvironment()
    assert environment.main_address == "127.0.0.1"
    with pytest.raises(ValueError) as error:
        _ = environment.main_port
    assert str(error.value) == (
        "MPIEnvironment cannot choose a rendezvous port: MASTER_PORT is not set, mpi4py is not installed, "
        "and none of OMPI_MCA_ess_base_jobid, PMIX_NAMESPACE (the MPI job id) is set. Set MASTER_PORT "
        "(`mpirun -x MASTER_PORT=29500`) or `pip install mpi4py`."
    )


def test_multi_node_without_master_addr_or_mpi4py(setenv):
    setenv(**OPEN_MPI)
    with pytest.raises(
        ValueError, match=r"cannot find the rendezvous host of a multi-node MPI job.*MASTER_ADDR"
    ):
        _ = MPIEnvironment().main_address


def test_multi_node_with_master_addr_derives_the_port_from_the_job_id(setenv):
    setenv(**OPEN_MPI, MASTER_ADDR="node0")
    environment = MPIEnvironment()
    assert (environment.main_address, environment.main_port) == ("node0", 26936)


def test_mpi4py_rank_zero_chooses_and_broadcasts_once(setenv, fake_mpi4py):
    setenv(**{**OPEN_MPI, "OMPI_COMM_WORLD_RANK": 0, "OMPI_COMM_WORLD_LOCAL_RANK": 0})
    root = FakeCommunicator(rank=0)
    fake_mpi4py(root)
    environment = MPIEnvironment()
    host, port = environment.main_address, environment.main_port
    assert host == socket.gethostname()  # several nodes: the others must reach rank 0's host
    assert 1 <= port <= 65535
    assert environment.main_address == host and environment.main_port == port
    assert root.broadcasts == [(host, port)]  # one collective, whatever the number of reads

    # Another rank receives rank 0's choice.
    setenv(OMPI_COMM_WORLD_RANK=5, OMPI_COMM_WORLD_LOCAL_RANK=1)
    fake_mpi4py(FakeCommunicator(rank=5, from_root=(host, port)))
    other = MPIEnvironment()
    assert (other.main_address, other.main_port) == (host, port)


def test_mpi4py_on_one_node_broadcasts_loopback(setenv, fake_mpi4py):
    setenv(
        **{**OPEN_MPI, "OMPI_COMM_WORLD_SIZE": 4, "OMPI_COMM_WORLD_RANK": 0, "OMPI_COMM_WORLD_LOCAL_RANK": 0}
    )
    fake_mpi4py(FakeCommunicator(rank=0))
    assert MPIEnvironment().main_address == "127.0.0.1"


def test_mpi4py_built_for_another_mpi(setenv, fake_mpi4py):
    setenv(**OPEN_MPI)
    fake_mpi4py(FakeCommunicator(rank=0))  # a singleton MPI: every process thinks it is rank 0
    with pytest.raises(ValueError, match=r"mpi4py reports rank 0 but OMPI_COMM_WORLD_RANK says 5"):
        _ = MPIEnvironment().main_port


def test_validate_settings_accepts_the_launch(setenv):
    setenv(**OPEN_MPI)
    MPIEnvironment().validate_settings(num_devices=4, num_nodes=2)


def test_validate_settings_devices_disagree(setenv):
    setenv(**OPEN_MPI)
    with pytest.raises(ValueError) as error:
        MPIEnvironment().validate_settings(num_devices=2, num_nodes=2)
    assert str(error.value) == (
        "mpirun started 4 process(es) on this node (OMPI_COMM_WORLD_LOCAL_SIZE=4) but devices=2. Pass "
        "devices=4, or launch 2 per node (Open MPI: `mpirun --npernode 2`; "
        "MPICH/Intel MPI: `mpiexec -ppn 2`)."
    )


def test_validate_settings_nodes_disagree(setenv):
    setenv(**HYDRA)
    with pytest.raises(ValueError) as error:
        MPIEnvironment().validate_settings(num_devices=2, num_nodes=1)
    assert str(error.value) == (
        "mpirun started 4 process(es) in all (PMI_SIZE=4) but devices=2 x num_nodes=1 needs 2. Launch with "
        "`mpirun -n 2`, or pass devices and num_nodes that multiply to 4."
    )


def test_setters_accept_mpis_values_and_refuse_others(setenv):
    setenv(**OPEN_MPI)
    environment = MPIEnvironment()
    environment.set_world_size(8)
    environment.set_global_rank(5)
    with pytest.raises(
        ValueError, match=r"Cannot set the world size to 4: .*OMPI_COMM_WORLD_SIZE=8.*mpirun -n 4"
    ):
        environment.set_world_size(4)
    with pytest.raises(ValueError, match=r"Cannot set the global rank to 0: .*OMPI_COMM_WORLD_RANK=5"):
        environment.set_global_rank(0)


@pytest.mark.parametrize(
    ("name", "value", "getter"),
    [
        ("OMPI_COMM_WORLD_SIZE", "eight", "world_size"),
        ("OMPI_COMM_WORLD_RANK", "5th", "global_rank"),
        ("OMPI_COMM_WORLD_LOCAL_RANK", "one", "local_rank"),
        ("OMPI_COMM_WORLD_LOCAL_SIZE", "4 procs", "local_size"),
    ],
)
def test_garbled_variables(setenv, name, value, getter):
    setenv(**OPEN_MPI)
    setenv(**{name: value})
    with pytest.raises(ValueError, match=rf"{name}='{value}' is not an integer"):
        _read(MPIEnvironment(), getter)


def test_repr_does_not_start_a_collective(setenv, fake_mpi4py):
    setenv(**OPEN_MPI)
    communicator = FakeCommunicator(rank=5)
    fake_mpi4py(communicator)
    assert repr(MPIEnvironment()) == (
        "MPIEnvironment(world_size=8, global_rank=5, local_rank=1, node_rank=1, rendezvous=None)"
    )
    assert communicator.broadcasts == []
