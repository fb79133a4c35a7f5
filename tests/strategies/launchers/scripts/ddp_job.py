"""A 2-process DDP job started by drivetrain's re-run-the-script launcher, with failure modes.

Usage: python ddp_job.py MODE PIDFILE_DIR
MODE: ok | exit-0-on-1-before-setup | raise-on-1 | raise-on-1-exiting-slowly | raise-on-0 | sigkill-1-while-0-computes | resetup
"""

import atexit
import os
import signal
import sys
import time
from pathlib import Path

import torch

import drivetrain as dt

mode, pid_dir = sys.argv[1], Path(sys.argv[2])


def say(line: str) -> None:
    os.write(1, f"{line}\n".encode())  # one write per line: the ranks share stdout


strategy = dt.connect(accelerator="cpu", strategy="ddp", devices=2)


def resetup() -> None:
    # fit, then test: the process group is set up and torn down several times in one job
    for attempt in range(3):
        strategy.setup_environment()
        total = strategy.all_reduce(torch.tensor([float(strategy.global_rank + 1)]), reduce_op="sum").item()
        say(f"rank={strategy.global_rank} attempt={attempt} sum={total}")
        strategy.teardown()


def run() -> None:
    if mode == "resetup":
        return resetup()
    if mode == "exit-0-on-1-before-setup" and os.environ.get("LOCAL_RANK") == "1":
        sys.exit(0)  # never joins: rank 0 would wait for it in the rendezvous
    strategy.setup_environment()
    rank = strategy.global_rank
    (pid_dir / f"rank{rank}.pid").write_text(str(os.getpid()))
    total = strategy.all_reduce(torch.tensor([float(rank + 1)]), reduce_op="sum").item()
    say(
        f"rank={rank} world={strategy.world_size} local={strategy.local_rank} sum={total} "
        f"threads={torch.get_num_threads()} omp={os.environ.get('OMP_NUM_THREADS')}"
    )
    if mode == "raise-on-1" and rank == 1:
        raise RuntimeError("deliberate failure on rank 1")
    if mode == "raise-on-1-exiting-slowly" and rank == 1:
        # As under heavy load: rank 1 has closed its connections (rank 0's collective fails at once) but
        # takes seconds more to end, so rank 0 cannot learn the cause from rank 1's exit in time.
        atexit.register(time.sleep, 4)
        raise RuntimeError("deliberate failure on rank 1")
    if mode == "raise-on-0" and rank == 0:
        raise RuntimeError("deliberate failure on rank 0")
    if mode == "sigkill-1-while-0-computes":
        if rank == 1:
            time.sleep(0.5)
            os.kill(os.getpid(), signal.SIGKILL)
        deadline = time.monotonic() + 60  # rank 0 computes, far from any collective
        while time.monotonic() < deadline:
            sum(i * i for i in range(1000))
        say("rank 0 was never interrupted")
    if mode == "raise-on-0":
        time.sleep(60)  # rank 1 would wait here forever if nobody stopped it
    strategy.barrier()
    strategy.teardown()


strategy.launcher.launch(run)
say(f"done rank={strategy.global_rank}")
