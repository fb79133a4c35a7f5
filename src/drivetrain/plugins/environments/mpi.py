"""Processes started by an MPI launcher (``mpirun``/``mpiexec``) without torchrun.

Open MPI tells each process ``OMPI_COMM_WORLD_SIZE``/``RANK``/``LOCAL_RANK``/``LOCAL_SIZE``;
MPICH and Intel MPI (Hydra) tell it ``PMI_SIZE``, ``PMI_RANK``, ``MPI_LOCALRANKID`` and
``MPI_LOCALNRANKS``. Neither names a rendezvous host and port, so they come, in this order, from:

1. ``MASTER_ADDR``/``MASTER_PORT`` when set (``mpirun -x MASTER_ADDR=host0 -x MASTER_PORT=29500``);
2. mpi4py, when installed: rank 0 picks its host name (``127.0.0.1`` when every rank shares one
   node) and a free port and broadcasts both — once, on first use, so the first access to
   :attr:`main_address` or :attr:`main_port` is a collective every rank must make;
3. otherwise the address is ``127.0.0.1`` when every rank shares one node, and the port is
   derived from the MPI job id (``OMPI_MCA_ess_base_jobid`` in Open MPI 4, ``PMIX_NAMESPACE``
   under PMIx, e.g. Open MPI 5), which every rank sees alike.

A multi-node job without ``MASTER_ADDR`` or mpi4py is an error that says what to set; so is a
missing port source (MPICH's Hydra exports no job id). Example::

    mpirun -n 4 python train.py   # Trainer(devices=4)
"""

from __future__ import annotations

import socket

from drivetrain.plugins.environments import _environ as env
from drivetrain.plugins.environments.launched import LaunchedEnvironment, LayoutVariables

_WHO = "MPIEnvironment"
_OPEN_MPI = {
    "size": "OMPI_COMM_WORLD_SIZE",
    "rank": "OMPI_COMM_WORLD_RANK",
    "local_rank": "OMPI_COMM_WORLD_LOCAL_RANK",
    "local_size": "OMPI_COMM_WORLD_LOCAL_SIZE",
}
_HYDRA = {
    "size": "PMI_SIZE",
    "rank": "PMI_RANK",
    "local_rank": "MPI_LOCALRANKID",
    "local_size": "MPI_LOCALNRANKS",
}
_JOB_ID_VARIABLES = ("OMPI_MCA_ess_base_jobid", "PMIX_NAMESPACE")


def _names() -> dict[str, str]:
    """The variable names of the MPI flavour that launched this process."""
    return _OPEN_MPI if env.is_set(_OPEN_MPI["size"]) else _HYDRA


def _free_port() -> int:
    # The port is released before the store binds it; another process could take it in between,
    # but only rank 0's host is involved and the window is a few milliseconds.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("", 0))
        return int(probe.getsockname()[1])


class MPIEnvironment(LaunchedEnvironment):
    """Reads the layout an MPI launcher announced and agrees on a rendezvous address."""

    who = _WHO

    def __init__(self) -> None:
        self._rendezvous: tuple[str, int] | None = None
        self._rendezvous_resolved = False

    @property
    def main_address(self) -> str:
        """``MASTER_ADDR``, else rank 0's host as agreed through mpi4py, else ``127.0.0.1`` on one node.

        Raises:
            ValueError: A multi-node job has neither ``MASTER_ADDR`` nor mpi4py.
        """
        address = env.get_str("MASTER_ADDR")
        if address:
            return address
        agreed = self._agreed_rendezvous()
        if agreed is not None:
            return agreed[0]
        if self.local_size() == self.world_size():
            return "127.0.0.1"
        raise ValueError(
            f"{_WHO} cannot find the rendezvous host of a multi-node MPI job: MASTER_ADDR is not set and "
            "mpi4py is not installed. Pass the host of rank 0 (Open MPI: `mpirun -x MASTER_ADDR=<host of "
            "rank 0> -x MASTER_PORT=29500`; MPICH/Intel MPI: `mpiexec -genv MASTER_ADDR <host> ...`), or "
            "`pip install mpi4py`."
        )

    @property
    def main_port(self) -> int:
        """``MASTER_PORT``, else the port rank 0 broadcast through mpi4py, else one derived from the job id.

        The derived port is ``10000 + crc32(job id) % 22768`` (10000-32767), the same on every rank.

        Raises:
            ValueError: None of ``MASTER_PORT``, mpi4py and an MPI job id variable is available.
        """
        port = env.get_port("MASTER_PORT")
        if port is not None:
            return port
        agreed = self._agreed_rendezvous()
        if agreed is not None:
            return agreed[1]
        for name in _JOB_ID_VARIABLES:
            job_id = env.get_str(name)
            if job_id:
                return env.port_from_job_id(job_id)
        raise ValueError(
            f"{_WHO} cannot choose a rendezvous port: MASTER_PORT is not set, mpi4py is not installed, and "
            f"none of {', '.join(_JOB_ID_VARIABLES)} (the MPI job id) is set. Set MASTER_PORT "
            "(`mpirun -x MASTER_PORT=29500`) or `pip install mpi4py`."
        )

    @staticmethod
    def detect() -> bool:
        """True when Open MPI's or Hydra's (MPICH, Intel MPI) size and rank variables are set."""
        return any(env.is_set(names["size"]) and env.is_set(names["rank"]) for names in (_OPEN_MPI, _HYDRA))

    def layout_variables(self) -> LayoutVariables:
        """Open MPI's ``OMPI_COMM_WORLD_*`` or Hydra's (MPICH, Intel MPI) ``PMI_*`` variables."""
        names = _names()
        return LayoutVariables(
            world_size=names["size"],
            global_rank=names["rank"],
            local_rank=names["local_rank"],
            set_by=", set by mpirun",
            world_size_fix="Relaunch with `mpirun -n {size}`.",
            rank_fix="Ranks under MPI are assigned by the launcher; do not set them.",
        )

    def local_size(self) -> int | None:
        """The number of this job's processes on this node, or ``None`` when the launcher does not say."""
        return env.get_int(_names()["local_size"], minimum=1)

    def processes_per_node(self) -> int | None:
        return self.local_size()

    def node_rank(self) -> int:
        """``global_rank // local_size``: MPI's default mapping fills each node with consecutive ranks.

        Raises:
            ValueError: The local size is unknown, or the ranks are not placed in consecutive blocks
                (e.g. ``--map-by node``), so the node rank cannot be computed.
        """
        names = _names()
        local_size = self.local_size()
        if local_size is None:
            raise ValueError(
                f"{_WHO} cannot compute the node rank: {names['local_size']} is not set. "
                "Launch with Open MPI, MPICH or Intel MPI, or use torchrun."
            )
        rank, local_rank = self.global_rank(), self.local_rank()
        if rank % local_size != local_rank:
            raise ValueError(
                f"{_WHO} expects each node to hold consecutive ranks, but rank {rank} has local rank "
                f"{local_rank} of {local_size}. Launch with the default by-slot/by-core mapping (not "
                "`--map-by node`), with the same number of processes on every node."
            )
        return rank // local_size

    def validate_settings(self, num_devices: int, num_nodes: int) -> None:
        """Check ``devices`` against processes per node and ``devices * num_nodes`` against the world size.

        Raises:
            ValueError: Either disagrees with what the MPI launcher started.
        """
        names = _names()
        local_size = self.local_size()
        if local_size is not None and local_size != num_devices:
            raise ValueError(
                f"mpirun started {local_size} process(es) on this node ({names['local_size']}={local_size}) "
                f"but devices={num_devices}. Pass devices={local_size}, or launch {num_devices} per node "
                f"(Open MPI: `mpirun --npernode {num_devices}`; "
                f"MPICH/Intel MPI: `mpiexec -ppn {num_devices}`)."
            )
        total = self.world_size()
        if total != num_devices * num_nodes:
            raise ValueError(
                f"mpirun started {total} process(es) in all ({names['size']}={total}) but "
                f"devices={num_devices} x num_nodes={num_nodes} needs {num_devices * num_nodes}. Launch with "
                f"`mpirun -n {num_devices * num_nodes}`, or pass devices and num_nodes that multiply to "
                f"{total}."
            )

    def _agreed_rendezvous(self) -> tuple[str, int] | None:
        """Rank 0's choice of host and port, broadcast through mpi4py; ``None`` without mpi4py.

        Computed once: the broadcast is a collective, so every rank must reach it the same number
        of times.
        """
        if not self._rendezvous_resolved:
            self._rendezvous = self._broadcast_rendezvous()
            self._rendezvous_resolved = True
        return self._rendezvous

    def _broadcast_rendezvous(self) -> tuple[str, int] | None:
        try:
            from mpi4py import MPI
        except ImportError:
            return None
        communicator = MPI.COMM_WORLD
        if communicator.Get_rank() != self.global_rank():
            raise ValueError(
                f"mpi4py reports rank {communicator.Get_rank()} but {_names()['rank']} says "
                f"{self.global_rank()}: mpi4py is built against a different MPI than the one that launched "
                "this process. Reinstall mpi4py against it (`pip install --no-binary mpi4py mpi4py`) or set "
                "MASTER_ADDR/MASTER_PORT."
            )
        choice = None
        if communicator.Get_rank() == 0:
            single_node = self.local_size() == self.world_size()
            choice = ("127.0.0.1" if single_node else socket.gethostname(), _free_port())
        host, port = communicator.bcast(choice, root=0)
        return str(host), int(port)

    def __repr__(self) -> str:
        # The rendezvous is shown only once agreed: resolving it is a collective and must not
        # happen inside a repr.
        return env.environment_repr(self, rendezvous=lambda: self._rendezvous)
