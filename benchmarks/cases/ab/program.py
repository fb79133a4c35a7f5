"""One process of the in-process A/B case: every variant's training, taking turns in blocks.

The variants are the step-time case's scripts (their ``train(config)``), imported into this one
process and run by :class:`benchmarks.inprocess.Turns`. ``BENCH_CONFIG`` holds the training
settings plus ``variants`` (name -> the script and its extra settings), ``rounds``,
``block_steps``, ``warmup_steps`` and ``process_index`` (which rotates the order of set-up and
of the rounds, so that processes differ in memory layout and start); the answer is one
``BENCH_RESULT`` line with every variant's (wall, CPU) block times, step count and final loss.
"""

from __future__ import annotations

import json
import sys

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

from benchmarks.cases import common
from benchmarks.cases.inprocess_variants import training_functions
from benchmarks.inprocess import TurnError, Turns


def main() -> None:
    config = common.load_config()
    # One intra-op thread: the overhead measured is the Python around the kernels, the process
    # CPU clock then covers all the work, and threads each owning an OpenMP pool cannot spin
    # against each other across hand-overs.
    torch.set_num_threads(1)
    rounds, block, warmup = config["rounds"], config["block_steps"], config["warmup_steps"]
    total = warmup + rounds * block
    names = list(config["variants"])
    shift = config.get("process_index", 0) % len(names)
    names = names[shift:] + names[:shift]
    functions = training_functions({n: config["variants"][n] for n in names}, config)
    turns = Turns(
        {name: (lambda f=functions[name]: f(total)) for name in names},
        warmup_steps=warmup,
        block_steps=block,
        register_hook=register_optimizer_step_post_hook,
        turn_timeout_s=config.get("turn_timeout_s", 120.0),
        first_row=config.get("process_index", 0),
    )
    try:
        outcomes = turns.run(rounds, log=lambda line: print(line, file=sys.stderr, flush=True))
    except TurnError as error:
        print(f"A/B run stopped: {error}", file=sys.stderr, flush=True)
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
            entry["final_loss"] = common.final_loss(model, {**config, "total_steps": total})
        variants[name] = entry
    result = {
        "variants": variants,
        "expected_steps": total,
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "drivetrain_file": common.drivetrain_file(),
        "max_rss_mib": common.max_rss_mib(),
    }
    print(common.RESULT_PREFIX + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
