"""One table of the GPU check in one process: every variant's training, taking turns in blocks.

The variants are the GPU case's scripts (their ``train(config, hold)``), imported into this
process and run by :class:`benchmarks.inprocess.Turns`, which waits for the GPU at the end of
every block before it takes the time. ``BENCH_CONFIG`` holds the training settings plus
``variants`` (name -> ``{"script": ..., "config": {...}}``), ``rounds``, ``block_steps``,
``warmup_steps``, ``seconds`` (the time after which no new round starts once 3 are done),
``hard_seconds`` (no round starts that would end after it) and ``record`` (a file
to which every finished round's blocks are appended as one JSON line, so that a process killed at
its time cap still leaves what it measured). The answer is one ``BENCH_RESULT`` line: each
variant's (wall, CPU) block times, step count, final loss (also for a variant stopped at the
deadline: its model is held from the start) and error, and the process's peak GPU memory.

Compiled variants of one model share Dynamo's work: ``torch.compile`` traces a module class's
code once and guards on the module's type and shapes, not on the instance, so the second
variant's first step reuses the first one's compiled graph. Every ``module.compile()`` of the
process shares one code object (``nn.Module._call_impl``), whose cache holds at most
``recompile_limit`` (8) graphs; the FP8 table needs up to 8 (bf16 and float8 models, float8 models
with different configs, the float8 layers' shapes under ``compile="layers"``), so the limit is
raised here: a variant that fell back to eager would measure the wrong thing.
"""

from __future__ import annotations

import importlib
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.optim.optimizer import register_optimizer_step_post_hook

from benchmarks.cases import common, gpt
from benchmarks.inprocess import TurnError, Turns


def main() -> None:
    config = common.load_config()
    started = time.monotonic()
    dry = bool(config.get("dry_run"))
    _raise_the_recompile_limit(64)
    rounds, block, warmup = config["rounds"], config["block_steps"], config["warmup_steps"]
    total = warmup + rounds * block
    held: dict[str, nn.Module] = {}
    functions = {}
    for name, spec in config["variants"].items():
        script = importlib.import_module(f"benchmarks.cases.gpu.{spec['script']}")
        settings = {
            **config,
            **spec.get("config", {}),
            "warmup_steps": 0,
            "timed_steps": total,
            "total_steps": total,
        }

        def train(script: Any = script, settings: dict[str, Any] = settings, name: str = name) -> None:
            script.train(settings, hold=lambda model: held.__setitem__(name, model))

        functions[name] = train
    record = Path(config["record"]) if config.get("record") else None

    def on_round(index: int, blocks: dict[str, tuple[float, float]]) -> None:
        if record is not None:
            with record.open("a") as file:
                file.write(json.dumps({"round": index, "blocks": blocks}) + "\n")

    turns = Turns(
        functions,
        warmup_steps=warmup,
        block_steps=block,
        register_hook=register_optimizer_step_post_hook,
        turn_timeout_s=config.get("turn_timeout_s", 300.0),
        synchronize=None if dry else torch.cuda.synchronize,
    )
    deadline = started + config["seconds"] if config.get("seconds") else None
    hard = started + config["hard_seconds"] if config.get("hard_seconds") else None
    try:
        outcomes = turns.run(
            rounds, log=_log, deadline=deadline, min_rounds=3, hard_deadline=hard, on_round=on_round
        )
    except TurnError as error:
        _log(f"A/B run stopped: {error}")
        raise SystemExit(3) from None
    variants = {}
    for name, outcome in outcomes.items():
        entry: dict[str, Any] = {
            "wall_s": [wall for wall, _ in outcome.blocks],
            "cpu_s": [cpu for _, cpu in outcome.blocks],
            "steps": outcome.steps,
            "stopped": outcome.stopped,
            "error": outcome.error,
        }
        model = held.get(name)
        if outcome.error is None and model is not None:
            entry["final_loss"] = gpt.final_loss(model, config, gpt.device_for(config))
        variants[name] = entry
    result = {
        "variants": variants,
        "expected_steps": total,
        "torch": torch.__version__,
        "drivetrain_file": common.drivetrain_file(),
        "gpu_max_allocated_gib": None if dry else torch.cuda.max_memory_allocated() / 1024**3,
        "gpu": None if dry else torch.cuda.get_device_name(),
        "seconds": time.monotonic() - started,
    }
    print(common.RESULT_PREFIX + json.dumps(result), flush=True)


def _raise_the_recompile_limit(limit: int) -> None:
    import torch._dynamo

    name = "recompile_limit" if hasattr(torch._dynamo.config, "recompile_limit") else "cache_size_limit"
    setattr(torch._dynamo.config, name, max(limit, getattr(torch._dynamo.config, name)))


def _log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
