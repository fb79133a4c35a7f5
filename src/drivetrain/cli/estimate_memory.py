"""``drivetrain estimate-memory MODULE:CLASS``: memory per process to train a model, per strategy and precision.

The model is built on the ``meta`` device (no memory, any size), from its class and keyword
arguments (``--init-args '{"width": 4096}'``). For each strategy and precision the table gives
the bytes each process holds for parameters, gradients and optimizer states — the model's
training state, without activations, buffers, the data, or the framework's own workspace::

    drivetrain estimate-memory mypackage.model:Transformer --init-args '{"layers": 48}' \\
        --num-processes 8 --strategy ddp fsdp deepspeed_stage_3 --precision 32-true bf16-mixed

How the bytes are counted: see :mod:`drivetrain.strategies.memory_estimate`, the estimator
``strategy="auto"`` also uses to choose between DDP and FSDP.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from drivetrain.cli import user_code
from drivetrain.strategies.memory_estimate import (
    OPTIMIZER_STATES,
    STRATEGIES,
    Estimate,
    count_parameters,
    estimate,
    format_bytes,
)

if TYPE_CHECKING:  # torch is imported when a model is built: `drivetrain --help` stays quick
    from torch import nn

__all__ = [
    "OPTIMIZER_STATES",
    "STRATEGIES",
    "Estimate",
    "build_model",
    "count_parameters",
    "estimate",
    "table",
]


def build_model(spec: str, init_args: dict[str, Any]) -> nn.Module:
    """``package.module:Class`` built on the meta device with ``init_args``."""
    from torch import nn

    from drivetrain.big_modeling import init_empty_weights

    module_name, _, class_name = spec.rpartition(":")  # rpartition: a Windows path has a colon too
    if not module_name or not class_name:
        raise ValueError(
            f"{spec!r} is not MODULE:CLASS (e.g. 'torchvision.models:resnet50', 'mymodels:Net' or "
            f"'./mymodels.py:Net')."
        )
    try:
        module = user_code.import_module(module_name)
    except ImportError as error:
        raise ValueError(f"cannot import {module_name!r}: {error}") from None
    factory = getattr(module, class_name, None)
    if not callable(factory):
        raise ValueError(f"{module_name} has no class or function {class_name!r}.")
    with init_empty_weights(include_buffers=True):
        model = factory(**init_args)
    if not isinstance(model, nn.Module):
        raise ValueError(f"{spec}(**init_args) gave a {type(model).__name__}, not a torch.nn.Module.")
    return model


def table(estimates: Sequence[Estimate]) -> str:
    rows = [("strategy", "precision", "weights", "gradients", "optimizer", "device total", "CPU")]
    rows += [
        (
            e.strategy,
            e.precision,
            format_bytes(e.weights),
            format_bytes(e.gradients),
            format_bytes(e.optimizer),
            format_bytes(e.device_total),
            format_bytes(e.cpu),
        )
        for e in estimates
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(lines)


def add_estimate_memory_command(commands: Any) -> None:
    parser = commands.add_parser(
        "estimate-memory",
        help="memory per process to train a model class, per strategy and precision (built on the meta device)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "model",
        metavar="MODULE:CLASS",
        help="the model class (or a function returning a module): a module of this folder or an installed "
        "package (mymodels:Net), or a file (./mymodels.py:Net)",
    )
    parser.add_argument(
        "--init-args", "--init_args", dest="init_args", default="{}", help="keyword arguments, as JSON"
    )
    parser.add_argument("-n", "--num-processes", "--num_processes", dest="num_processes", type=int, default=1)
    parser.add_argument(
        "--strategy", nargs="+", default=None, choices=STRATEGIES, help="default: all that fit -n"
    )
    parser.add_argument("--precision", nargs="+", default=["32-true", "bf16-mixed", "bf16-true"])
    parser.add_argument("--optimizer", default="adam", choices=sorted(OPTIMIZER_STATES))
    parser.add_argument("--json", action="store_true", help="print the estimates as JSON")
    parser.set_defaults(run=run_estimate_memory)


def run_estimate_memory(args: argparse.Namespace) -> int:
    try:
        init_args = json.loads(args.init_args)
        if not isinstance(init_args, dict):
            raise ValueError(
                "--init-args must be a JSON object of keyword arguments, e.g. '{\"width\": 64}'."
            )
        model = build_model(args.model, init_args)
        strategies = args.strategy or [
            s for s in STRATEGIES if (s == "single_device") == (args.num_processes == 1)
        ]
        trainable, frozen = count_parameters(model)
        estimates = [
            estimate(trainable, frozen, strategy, precision, args.num_processes, args.optimizer)
            for strategy in strategies
            for precision in args.precision
        ]
    except (ValueError, TypeError) as error:  # json.JSONDecodeError is a ValueError
        print(f"drivetrain estimate-memory: {error}", file=sys.stderr)
        return 2
    if args.json:
        print(
            json.dumps(
                [{**dataclasses.asdict(e), "device_total": e.device_total} for e in estimates], indent=1
            )
        )
        return 0
    print(
        f"{args.model}: {trainable + frozen:,} parameters ({trainable:,} trainable), {args.num_processes} "
        f"process(es), {args.optimizer}; bytes per process for weights, gradients and optimizer states "
        f"(activations not included)"
    )
    print(table(estimates))
    return 0
