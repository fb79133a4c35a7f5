"""Run under torchrun by test_environment_launches.py: check TorchElasticEnvironment against the
variables torchrun really sets, then rendezvous through it and all-reduce the ranks."""

from __future__ import annotations

import datetime
import os

import torch
import torch.distributed as dist

from drivetrain.plugins.environments import TorchElasticEnvironment, detect_cluster_environment

environment = TorchElasticEnvironment()
assert TorchElasticEnvironment.detect(), "TORCHELASTIC_RUN_ID is not set under torchrun"
detected = detect_cluster_environment()
assert type(detected) is TorchElasticEnvironment, detected
assert environment.creates_processes_externally
assert environment.world_size() == int(os.environ["WORLD_SIZE"]) == 2
assert environment.global_rank() == int(os.environ["RANK"])
assert environment.local_rank() == int(os.environ["LOCAL_RANK"]) == environment.global_rank()
assert environment.node_rank() == int(os.environ["GROUP_RANK"]) == 0
assert environment.main_address == os.environ["MASTER_ADDR"]
assert environment.main_port == int(os.environ["MASTER_PORT"]) > 0
environment.validate_settings(num_devices=2, num_nodes=1)
environment.set_world_size(2)
environment.set_global_rank(environment.global_rank())

# With the agent store, torchrun's agent already serves the TCP store; every rank is a client.
store = dist.TCPStore(
    environment.main_address,
    environment.main_port,
    environment.world_size(),
    is_master=not environment.uses_agent_store and environment.global_rank() == 0,
    timeout=datetime.timedelta(seconds=30),
)
dist.init_process_group(
    "gloo", store=store, rank=environment.global_rank(), world_size=environment.world_size()
)
total = torch.tensor([environment.global_rank() + 1])
dist.all_reduce(total)
# One write per line: the ranks share stdout, and print() writes the text and the newline separately.
line = (
    f"rank={environment.global_rank()} local_rank={environment.local_rank()} "
    f"agent_store={environment.uses_agent_store} sum={int(total.item())}"
)
os.write(1, f"{line}\n".encode())
dist.destroy_process_group()
