"""The step-time case's training scripts as functions, for the cases that run them in one process.

The in-process A/B case and the instruction-count case import the same ``train(config)`` that
the fresh-process step-time case runs as ``__main__``, so all three measure the same code.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

from torch import nn

Train = Callable[[int], tuple[nn.Module, int]]

# The tiny MLP's settings, shared by the in-process cases; the wide MLP's as in the step-time case.
MODEL = {"model": "tiny", "batch_size": 64, "lr": 0.05, "seed": 0}
WIDE_MODEL = {"model": "wide", "batch_size": 64, "lr": 0.01, "seed": 0}
# name -> the step-time script and its extra settings.
RAW = {"raw": {"script": "raw"}}
DRIVETRAIN = {
    "drivetrain_trainer": {"script": "drivetrain_trainer"},
    "drivetrain_trainer_log": {"script": "drivetrain_trainer", "config": {"log_metric": True}},
    "drivetrain_accelerator": {"script": "drivetrain_accelerator"},
}
PEERS = {
    "lightning_trainer": {"script": "lightning_trainer"},
    "lightning_trainer_log": {"script": "lightning_trainer", "config": {"log_metric": True}},
    "fabric": {"script": "fabric"},
    "accelerate_loop": {"script": "accelerate_loop"},
}
LABELS = {
    "raw": "raw PyTorch",
    "drivetrain_trainer": "drivetrain Trainer",
    "drivetrain_trainer_log": "drivetrain Trainer + self.log",
    "drivetrain_accelerator": "drivetrain Accelerator",
    "lightning_trainer": "Lightning Trainer",
    "lightning_trainer_log": "Lightning Trainer + self.log",
    "fabric": "Lightning Fabric",
    "accelerate_loop": "HF Accelerate",
}


def training_functions(
    variants: Mapping[str, Mapping[str, Any]], settings: Mapping[str, Any]
) -> dict[str, Train]:
    """name -> a function training that variant for a given number of steps.

    Args:
        variants: name -> ``{"script": <module in cases/step_time>, "config": {...extra settings}}``.
        settings: the shared training settings (model, batch size, learning rate, seed).
    """
    functions: dict[str, Train] = {}
    for name, spec in variants.items():
        module = importlib.import_module(f"benchmarks.cases.step_time.{spec['script']}")
        extra = dict(spec.get("config", {}))

        def train(steps: int, module: Any = module, extra: dict[str, Any] = extra) -> tuple[nn.Module, int]:
            config = {**settings, **extra, "warmup_steps": 0, "timed_steps": steps, "total_steps": steps}
            return module.train(config)

        functions[name] = train
    return functions
