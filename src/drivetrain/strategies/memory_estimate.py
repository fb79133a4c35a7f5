"""The training state's bytes per process (weights, gradients, optimizer states), per strategy and precision.

One estimator for ``drivetrain estimate-memory`` and for ``strategy="auto"``, which picks FSDP
when DDP's share would not fit the device. Counted from parameter shapes only, so a model built
on the ``meta`` device (no memory, any size) is estimated as well as a real one.

How the bytes are counted (``P`` trainable parameters, ``F`` frozen ones, ``N`` processes; Adam
keeps 2 states per parameter, SGD with momentum 1, plain SGD 0; ``s`` = bytes of a state):

* precision: ``64-true`` 8 bytes a weight; ``32-true``, ``16-mixed``, ``bf16-mixed`` 4 (autocast
  computes in 16 bits but keeps 32-bit weights, gradients and states), ``fp8`` 4 too (float8
  copies are made inside each matmul); ``16-true``, ``bf16-true``
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

import dataclasses
from typing import TYPE_CHECKING

if TYPE_CHECKING:
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
_OPTIMIZER_NAMES = {"adam": "Adam", "adamw": "AdamW", "sgd": "SGD", "sgd_momentum": "SGD-momentum"}
_WEIGHT_BYTES = {
    "64-true": 8,
    "32-true": 4,
    "16-mixed": 4,
    "bf16-mixed": 4,
    "16-true": 2,
    "bf16-true": 2,
    "fp8": 4,  # float32 weights; the float8 copies exist only inside each matmul
}


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


def format_bytes(value: float) -> str:
    """``1536`` → ``"1.50 KiB"``."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if value >= scale:
            return f"{value / scale:.2f} {unit}"
    return f"{value:.0f} B"


@dataclasses.dataclass(frozen=True)
class AutoStrategyChoice:
    """What ``strategy="auto"`` chose for a model on several processes, and why."""

    strategy: str  # "ddp" or "fsdp"
    why: str  # the sizes and the limit, as a sentence
    num_processes: int
    ddp: Estimate
    fsdp: Estimate
    limit: int | None

    @property
    def reason(self) -> str:
        """The choice and why, in one line (what the front doors log)."""
        return (
            f"strategy='auto' chose {self.strategy.upper()} over {self.num_processes} processes: {self.why}"
        )


def choose_data_parallel(
    model: nn.Module,
    precision: str,
    num_processes: int,
    memory: tuple[int, str] | None,
    device: str,
    optimizer: str = "adam",
) -> AutoStrategyChoice:
    """DDP, or FSDP when DDP's full copy of the training state per process would not fit ``memory``.

    Args:
        model: counted from its parameter shapes (a model on the meta device works).
        precision: the precision's name; one this estimator does not know counts as 32 bits.
        num_processes: the world size.
        memory: bytes one process may fill and where the figure comes from (the hardware
            accelerator's :meth:`~drivetrain.accelerators.Accelerator.training_memory`), or
            ``None``: no limit known, so DDP.
        device: the device's name for the message (``"cpu"``, ``"cuda:0"``).
        optimizer: the optimizer the estimate assumes (the optimizers are built later).
    """
    trainable, frozen = count_parameters(model)
    counted = precision if precision in _WEIGHT_BYTES else "32-true"
    ddp = estimate(trainable, frozen, "ddp", counted, num_processes, optimizer)
    fsdp = estimate(trainable, frozen, "fsdp", counted, num_processes, optimizer)
    state = f"weights, gradients and {_OPTIMIZER_NAMES.get(optimizer, optimizer)} states in {counted}"
    n = num_processes
    if memory is None:
        why = f"no memory limit is known for {device} (DDP holds {format_bytes(ddp.device_total)} of {state} per process)."
        return AutoStrategyChoice("ddp", why, n, ddp, fsdp, None)
    limit, source = memory
    if ddp.device_total <= limit:
        why = (
            f"{format_bytes(ddp.device_total)} of {state} per process fits the {format_bytes(limit)} of {device} "
            f"({source})."
        )
        return AutoStrategyChoice("ddp", why, n, ddp, fsdp, limit)
    why = (
        f"DDP would hold {format_bytes(ddp.device_total)} of {state} per process, more than the "
        f"{format_bytes(limit)} of {device} ({source}); FSDP shards it to {format_bytes(fsdp.device_total)} per "
        f"process."
    )
    if fsdp.device_total > limit:
        why += (
            " That is still over the limit: use more processes, strategy='fsdp_cpu_offload', or a 16-bit "
            "precision ('bf16-true')."
        )
    return AutoStrategyChoice("fsdp", why, n, ddp, fsdp, limit)
