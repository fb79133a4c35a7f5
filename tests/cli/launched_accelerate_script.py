"""An Accelerate-style script that reports what ``drivetrain launch`` gave it, after a real collective.

Writes ``OUT/rank<R>.json`` (``OUT``: the first argument) with the run's facts: world size,
precision, debug mode, threads, the variables Accelerate's launch options set, and which entry
point ran (``main`` when run as a script; ``train`` through ``--main_training_function train``).
With ``fail`` as the second argument, rank 1 raises instead.
"""

import json
import os
import sys
from pathlib import Path

import torch

import drivetrain as dt


def report(entry: str) -> None:
    out = Path(sys.argv[1])
    accelerator = dt.Accelerator()
    if sys.argv[2:] == ["fail"] and accelerator.process_index == 1:
        raise RuntimeError("rank 1 failed on purpose")
    ranks = accelerator.gather(torch.tensor([accelerator.process_index])).tolist()
    (out / f"rank{accelerator.process_index}.json").write_text(
        json.dumps(
            {
                "entry": entry,
                "name": __name__,
                "ranks": ranks,
                "world": accelerator.num_processes,
                "device": accelerator.device.type,
                "mixed_precision": accelerator.mixed_precision,
                "debug": accelerator.state.debug,
                "threads": torch.get_num_threads(),
                "variables": {
                    name: os.environ.get(name)
                    for name in ("CUDA_VISIBLE_DEVICES", "XLA_DOWNCAST_BF16", "OMP_NUM_THREADS")
                },
            }
        )
    )
    print(f"rank {accelerator.process_index} reported", flush=True)


def train() -> None:
    report("train")


def main() -> None:
    report("main")


if __name__ == "__main__":
    main()
