"""``drivetrain estimate-memory MODULE:CLASS``: memory per process to train a model, per strategy and precision.

The model is built on the ``meta`` device (no memory, any size), from its class and keyword
arguments (``--init-args '{"width": 4096}'``). For each strategy and precision the table gives
the bytes each process holds for parameters, gradients and optimizer states — the model's
training state, without activations, buffers, the data, or the framework's own workspace::

    drivetrain estimate-memory mypackage.model:Transformer --init-args '{"layers": 48}' \\
        --num-processes 8 --strategy ddp fsdp deepspeed_stage_3 --precision 32-true bf16-mixed

How the bytes are counted (``P`` trainable parameters, ``F`` frozen ones, ``N`` processes; Adam
keeps 2 states per parameter, SGD with momentum 1, plain SGD 0; ``s`` = bytes of a state):

* precision: ``64-true`` 8 bytes a weight; ``32-true``, ``16-mixed``, ``bf16-mixed`` 4 (autocast
  computes in 16 bits but keeps 32-bit weights, gradients and states); ``16-true``, ``bf16-true``
  2, states too;
* ``ddp`` (and one process): everything on every process;
* ``fsdp``: weights, gradients and states sharded over the ``N`` processes; ``fsdp_cpu_offload``
  keeps them in CPU memory;
* ``deepspeed_stage_1/2/3``: with a 16-bit precision DeepSpeed keeps 16-bit weights and gradients
  plus 32-bit master weights and states (``4 + 8`` bytes for Adam); stage 1 shards the states,
  stage 2 also the gradients, stage 3 also the weights; ``_offload`` moves the states (and in
  stage 3 the weights) to CPU memory.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # torch is imported when a model is built: `drivetrain --help` stays quick
    from torch import nn

STRATEGIES = (
    "single_device",
    "ddp",
    "fsdp",
    "fsdp_cpu_offload",
    "deepspeed_stage_1",
    "deepspeed_stage_2",
    "deepspeed_stage_2_offload",
    "deepspeed_stage_3",
    "deepspeed_stage_3_offload",
)
OPTIMIZER_STATES = {"adam": 2, "adamw": 2, "sgd": 0, "sgd_momentum": 1}
_WEIGHT_BYTES = {"64-true": 8, "32-true": 4, "16-mixed": 4, "bf16-mixed": 4, "16-true": 2, "bf16-true": 2}


@dataclasses.dataclass(frozen=True)
class Estimate:
    """Bytes per process: on the device (weights, gradients, optimizer states) and in CPU memory."""

    strategy: str
    precision: str
    weights: float
    gradients: float
    optimizer: float
    cpu: float

    @property
    def device_total(self) -> float:
        return self.weights + self.gradients + self.optimizer


def estimate(
    trainable: int, frozen: int, strategy: str, precision: str, num_processes: int, optimizer: str = "adam"
) -> Estimate:
    """The training state's bytes per process (see the module docstring for the rules).

    Raises:
        ValueError: an unknown strategy, precision or optimizer, or a process count that does not fit.
    """
    from drivetrain.plugins.precision import canonical_precision

    if strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r}; estimate-memory knows {', '.join(STRATEGIES)}.")
    precision = canonical_precision(precision)
    if precision not in _WEIGHT_BYTES:
        raise ValueError(f"precision {precision!r} has no estimate; use one of {', '.join(_WEIGHT_BYTES)}.")
    if optimizer not in OPTIMIZER_STATES:
        raise ValueError(f"unknown optimizer {optimizer!r}; use one of {', '.join(OPTIMIZER_STATES)}.")
    if num_processes < 1 or (strategy == "single_device" and num_processes != 1):
        raise ValueError(f"{strategy} cannot run on {num_processes} processes.")
    states = OPTIMIZER_STATES[optimizer]
    n = num_processes
    total = trainable + frozen
    if strategy.startswith("deepspeed"):
        stage = int(strategy.split("_")[2])
        sixteen_bit = _WEIGHT_BYTES[precision] == 2 or precision in ("16-mixed", "bf16-mixed")
        weight = 2 if sixteen_bit else _WEIGHT_BYTES[precision]
        # 16-bit training keeps a 32-bit master copy beside the states (none is needed in 32 bits).
        state = trainable * ((4 + 4 * states) if sixteen_bit else weight * states)
        weights = total * weight / (n if stage == 3 else 1)
        gradients = trainable * weight / (n if stage >= 2 else 1)
        optimizer_bytes = state / n
        cpu = 0.0
        if strategy.endswith("offload"):
            cpu, optimizer_bytes = optimizer_bytes, 0.0
            if stage == 3:
                cpu, weights = cpu + weights, 0.0
        return Estimate(strategy, precision, weights, gradients, optimizer_bytes, cpu)
    weight = _WEIGHT_BYTES[precision]
    weights, gradients, optimizer_bytes = total * weight, trainable * weight, trainable * weight * states
    if strategy.startswith("fsdp"):
        weights, gradients, optimizer_bytes = weights / n, gradients / n, optimizer_bytes / n
        if strategy == "fsdp_cpu_offload":
            return Estimate(strategy, precision, 0.0, 0.0, 0.0, weights + gradients + optimizer_bytes)
    return Estimate(strategy, precision, weights, gradients, optimizer_bytes, 0.0)


def count_parameters(model: nn.Module) -> tuple[int, int]:
    """(trainable, frozen) parameter counts; shared parameters count once."""
    trainable = frozen = 0
    for parameter in model.parameters():  # parameters() yields a shared parameter once
        if parameter.requires_grad:
            trainable += parameter.numel()
        else:
            frozen += parameter.numel()
    return trainable, frozen


def build_model(spec: str, init_args: dict[str, Any]) -> nn.Module:
    """``package.module:Class`` built on the meta device with ``init_args``."""
    from torch import nn

    from drivetrain.big_modeling import init_empty_weights

    module_name, _, class_name = spec.partition(":")
    if not module_name or not class_name:
        raise ValueError(
            f"{spec!r} is not MODULE:CLASS (e.g. 'torchvision.models:resnet50' or 'mymodels:Net')."
        )
    try:
        module = importlib.import_module(module_name)
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


def _size(value: float) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if value >= scale:
            return f"{value / scale:.2f} {unit}"
    return f"{value:.0f} B"


def table(estimates: Sequence[Estimate]) -> str:
    rows = [("strategy", "precision", "weights", "gradients", "optimizer", "device total", "CPU")]
    rows += [
        (
            e.strategy,
            e.precision,
            _size(e.weights),
            _size(e.gradients),
            _size(e.optimizer),
            _size(e.device_total),
            _size(e.cpu),
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
        "model", metavar="MODULE:CLASS", help="the model class (or a function returning a module)"
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
