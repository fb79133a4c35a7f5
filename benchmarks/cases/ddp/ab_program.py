"""One launch of the DDP A/B: raw DDP and drivetrain's doors in the same 2 processes, taking turns.

Started by ``torchrun --standalone --nproc-per-node=2`` (the raw loop's own launcher). Each rank
joins one gloo process group, builds every variant's training (the step-time case's
``train(config)``: raw ``DistributedDataParallel``, drivetrain's Trainer with ``devices=2`` and
its Accelerator, which both find the launcher's environment and join that group) and runs them in
turns of ``block_steps`` optimizer steps with :class:`benchmarks.inprocess.Turns`. Both ranks follow
the same schedule, so both run the same variant at a time: a turn ends at the end of an optimizer
step, when that step's gradient all-reduce is complete on both ranks, and the next variant's first
collective meets its counterpart on the other rank.

Rank 0 answers with one ``BENCH_RESULT`` line: every variant's (wall, CPU) block times on rank 0,
its step count and its final loss.
"""

from __future__ import annotations

import json
import sys

import torch
import torch.distributed as dist
from torch.optim.optimizer import register_optimizer_step_post_hook

from benchmarks.cases import common
from benchmarks.cases.inprocess_variants import training_functions
from benchmarks.inprocess import TurnError, Turns


def main() -> None:
    config = common.load_config()
    torch.set_num_threads(1)  # OMP_NUM_THREADS=1 too: one core per rank on the 2-core machine
    # One group for every variant, made the way the raw loop makes it; the doors join it.
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    rounds, block, warmup = config["rounds"], config["block_steps"], config["warmup_steps"]
    total = warmup + rounds * block
    names = list(config["variants"])
    # Both ranks must build and run the variants in the same order: the same rotation on both.
    shift = config.get("process_index", 0) % len(names)
    names = names[shift:] + names[:shift]
    settings = {**config, "total_steps": total}
    functions = training_functions({n: config["variants"][n] for n in names}, settings)
    turns = Turns(
        {name: (lambda f=functions[name]: f(total)) for name in names},
        warmup_steps=warmup,
        block_steps=block,
        register_hook=register_optimizer_step_post_hook,
        turn_timeout_s=config.get("turn_timeout_s", 120.0),
        first_row=config.get("process_index", 0),
    )
    log = (lambda line: print(line, file=sys.stderr, flush=True)) if rank == 0 else (lambda _line: None)
    try:
        outcomes = turns.run(rounds, log=log)
    except TurnError as error:
        print(f"rank {rank}: DDP A/B run stopped: {error}", file=sys.stderr, flush=True)
        raise SystemExit(3) from None

    variants = {}
    for name, outcome in outcomes.items():
        entry = {
            "wall_s": [wall for wall, _ in outcome.blocks],
            "cpu_s": [cpu for _, cpu in outcome.blocks],
            "steps": outcome.steps,
            "error": outcome.error,
        }
        if outcome.error is None:
            model, _rank = outcome.result
            entry["final_loss"] = common.final_loss(model, settings)
        variants[name] = entry
    if rank == 0:
        result = {
            "variants": variants,
            "expected_steps": total,
            "threads": torch.get_num_threads(),
            "world_size": dist.get_world_size(),
            "torch": torch.__version__,
            "drivetrain_file": common.drivetrain_file(),
            "max_rss_mib": common.max_rss_mib(),
        }
        print(common.RESULT_PREFIX + json.dumps(result), flush=True)
    # Leave together (a rank that tears gloo down while the other still works makes it abort).
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
