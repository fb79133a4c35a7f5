"""Run under mpirun by test_environment_launches.py: check MPIEnvironment against the variables
Open MPI really sets, rendezvous through it (mpi4py broadcast) and all-reduce the ranks."""

from __future__ import annotations

import datetime
import os

import torch
import torch.distributed as dist

from drivetrain.plugins.environments import MPIEnvironment, detect_cluster_environment
from drivetrain.plugins.environments._environ import port_from_job_id

environment = MPIEnvironment()
assert MPIEnvironment.detect(), "no MPI variables under mpirun"
detected = detect_cluster_environment()
assert type(detected) is MPIEnvironment, detected
assert environment.world_size() == int(os.environ["OMPI_COMM_WORLD_SIZE"]) == 2
assert environment.global_rank() == int(os.environ["OMPI_COMM_WORLD_RANK"])
assert environment.local_rank() == environment.global_rank()
assert environment.node_rank() == 0
environment.validate_settings(num_devices=2, num_nodes=1)

store = dist.TCPStore(
    environment.main_address,
    environment.main_port,
    environment.world_size(),
    is_master=environment.global_rank() == 0,
    timeout=datetime.timedelta(seconds=30),
)
dist.init_process_group(
    "gloo", store=store, rank=environment.global_rank(), world_size=environment.world_size()
)
total = torch.tensor([environment.global_rank() + 1])
dist.all_reduce(total)

# The fallback without mpi4py derives the port from the job id: every rank must see the same id.
job_id = os.environ.get("OMPI_MCA_ess_base_jobid") or os.environ["PMIX_NAMESPACE"]  # noqa: SIM112
derived = [None, None]
dist.all_gather_object(derived, port_from_job_id(job_id))
# One write per line: the ranks share stdout, and print() writes the text and the newline separately.
line = (
    f"rank={environment.global_rank()} address={environment.main_address} sum={int(total.item())} "
    f"derived_ports_agree={derived[0] == derived[1]}"
)
os.write(1, f"{line}\n".encode())
dist.destroy_process_group()
