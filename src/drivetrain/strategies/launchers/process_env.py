"""The variables a launcher gives each process it starts (torchrun's contract), and thread counts."""

from __future__ import annotations

import os


def worker_environment(
    *, local_rank: int, node_rank: int, num_processes: int, num_nodes: int, main_address: str, main_port: int
) -> dict[str, str]:
    """torchrun's variables for local process ``local_rank`` of node ``node_rank``."""
    return {
        "LOCAL_RANK": str(local_rank),
        "RANK": str(node_rank * num_processes + local_rank),
        "NODE_RANK": str(node_rank),
        "GROUP_RANK": str(node_rank),
        "WORLD_SIZE": str(num_nodes * num_processes),
        "LOCAL_WORLD_SIZE": str(num_processes),
        "MASTER_ADDR": main_address,
        "MASTER_PORT": str(main_port),
    }


def threads_per_process(num_processes: int) -> int:
    """CPU threads each of ``num_processes`` local processes should use.

    Without a limit every process starts one thread per core and they fight over the cores (per-step
    time roughly triples with 2 processes on 2 cores). ``OMP_NUM_THREADS``, when the user set it, wins.
    """
    configured = os.environ.get("OMP_NUM_THREADS")
    if configured and configured.isdigit() and int(configured) > 0:
        return int(configured)
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    return max(1, cores // max(1, num_processes))
