"""One node's share of a 2-node job: connect(num_nodes=2), all-reduce, report.

Usage: python node_job.py DEVICES_PER_NODE   (the node's rank and rendezvous come from the environment
or from ``drivetrain launch``).
"""

import os
import socket
import sys

import torch

import drivetrain as dt

devices = int(sys.argv[1])
strategy = dt.connect(accelerator="cpu", strategy="ddp", devices=devices, num_nodes=2)


def run() -> None:
    strategy.setup_environment()
    total = strategy.all_reduce(torch.tensor([float(strategy.global_rank + 1)]), reduce_op="sum").item()
    addresses = strategy.all_gather_object(os.environ.get("NODE_ADDRESS", socket.gethostname()))
    line = (
        f"rank={strategy.global_rank} node={strategy.node_rank} world={strategy.world_size} sum={total} "
        f"addresses={sorted(set(addresses))}"
    )
    os.write(1, f"{line}\n".encode())
    strategy.barrier()
    strategy.teardown()


launcher = strategy.launcher
launcher.launch(run) if launcher is not None else run()
