"""The DeepSpeed config: built from :class:`~drivetrain.strategies.DeepSpeedStrategy`'s arguments or
taken from the user (a dict or a JSON file), checked for contradictions, and its ``"auto"`` values
filled in from the precision, the data loader's batch size and the world size.

Pure functions of plain data; nothing here imports DeepSpeed.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

STAGES = (0, 1, 2, 3)
OFFLOAD_DEVICES = ("cpu", "nvme")


def load_user_config(config: dict[str, Any] | str | Path) -> dict[str, Any]:
    """A deep copy of a config dict, or the parsed JSON file at ``config``."""
    if isinstance(config, dict):
        return copy.deepcopy(config)
    if isinstance(config, (str, Path)):
        path = Path(config)
        if not path.is_file():
            raise ValueError(
                f"config={config!r}: no such file. Pass a DeepSpeed config dict or the path of a JSON file."
            )
        try:
            loaded = json.loads(path.read_text())
        except json.JSONDecodeError as error:
            raise ValueError(f"The DeepSpeed config file {path} is not valid JSON: {error}.") from None
        if not isinstance(loaded, dict):
            raise ValueError(
                f"The DeepSpeed config file {path} holds a {type(loaded).__name__}, not a JSON object."
            )
        return loaded
    raise TypeError(
        f"config= expects a dict or the path of a JSON file, got {type(config).__name__} ({config!r})."
    )


def config_from_arguments(
    *,
    stage: int,
    offload_optimizer: bool,
    offload_parameters: bool,
    offload_device: str,
    nvme_path: str | None,
    gradient_clipping: float | None,
    pin_memory: bool,
) -> dict[str, Any]:
    """The config the strategy's own arguments describe (checked by :func:`check_zero_settings`)."""
    zero: dict[str, Any] = {"stage": stage}
    target: dict[str, Any] = {"device": offload_device, "pin_memory": pin_memory}
    if offload_device == "nvme":
        target["nvme_path"] = nvme_path
    if offload_optimizer:
        zero["offload_optimizer"] = dict(target)
    if offload_parameters:
        zero["offload_param"] = dict(target)
    config: dict[str, Any] = {"zero_optimization": zero}
    if gradient_clipping is not None:
        config["gradient_clipping"] = gradient_clipping
    return config


def check_arguments(
    *, stage: Any, offload_optimizer: Any, offload_parameters: Any, offload_device: Any, nvme_path: Any
) -> None:
    """Reject values outside the documented ones before any config is built."""
    if isinstance(stage, bool) or stage not in STAGES:
        raise ValueError(f"stage={stage!r} is not a ZeRO stage; use 0 (none), 1, 2 or 3.")
    for name, value in (("offload_optimizer", offload_optimizer), ("offload_parameters", offload_parameters)):
        if not isinstance(value, bool):
            raise TypeError(f"{name}= expects True or False, got {value!r}.")
    if offload_device not in OFFLOAD_DEVICES:
        raise ValueError(f"offload_device={offload_device!r} is not supported; use 'cpu' or 'nvme'.")
    if offload_device == "nvme" and not nvme_path:
        raise ValueError("offload_device='nvme' needs nvme_path='/local/nvme/folder' (a fast local disk).")
    if nvme_path and offload_device != "nvme":
        raise ValueError(
            f"nvme_path={nvme_path!r} is only used with offload_device='nvme'; drop one of them."
        )


def check_zero_settings(config: dict[str, Any]) -> None:
    """Offload settings that contradict the ZeRO stage are errors (DeepSpeed would ignore them silently)."""
    zero = config.get("zero_optimization") or {}
    if not isinstance(zero, dict):
        raise ValueError(f"zero_optimization must be a dict in the DeepSpeed config, got {zero!r}.")
    stage = zero.get("stage", 0)
    if stage not in STAGES:
        raise ValueError(f"zero_optimization.stage={stage!r} is not a ZeRO stage; use 0, 1, 2 or 3.")
    if _offloads(zero.get("offload_param")) and stage != 3:
        raise ValueError(
            f"Parameter offload (offload_param / offload_parameters=True) needs ZeRO stage 3, but the stage is "
            f"{stage}: only stage 3 partitions parameters. Use stage=3 (e.g. strategy='deepspeed_stage_3_offload'), "
            f"or offload only the optimizer."
        )
    if _offloads(zero.get("offload_optimizer")) and stage == 0:
        raise ValueError(
            "Optimizer offload (offload_optimizer=True) needs ZeRO stage 1, 2 or 3, but the stage is 0. "
            "Use stage=2 (e.g. strategy='deepspeed_stage_2_offload')."
        )


def _offloads(section: Any) -> bool:
    return isinstance(section, dict) and section.get("device", "none") not in ("none", None)


def zero_stage(config: dict[str, Any]) -> int:
    return int((config.get("zero_optimization") or {}).get("stage", 0))


def fill_precision(config: dict[str, Any], precision: str) -> str:
    """Fill the config's ``bf16``/``fp16`` sections from ``precision``; return the precision to train in.

    A config that enables ``bf16`` or ``fp16`` itself wins over ``"32-true"`` (the default), and
    the returned name (``"bf16-mixed"``/``"16-mixed"``) tells the caller to switch its precision
    plugin to match. A config that contradicts any other precision is an error.
    """
    explicit = {
        section: bool(config[section]["enabled"])
        for section in ("bf16", "fp16")
        if isinstance(config.get(section), dict) and config[section].get("enabled", "auto") != "auto"
    }
    enabled = [section for section, on in explicit.items() if on]
    if len(enabled) > 1:
        raise ValueError("The DeepSpeed config enables both bf16 and fp16; enable at most one.")
    wanted = _SECTIONS.get(precision)
    if enabled and enabled[0] != wanted:
        if precision != "32-true":
            raise ValueError(
                f"The DeepSpeed config enables {enabled[0]}, but precision={precision!r}. Set "
                f"{enabled[0]}.enabled to 'auto' (filled from the precision), or pass the matching precision."
            )
        wanted = enabled[0]
        precision = "bf16-mixed" if wanted == "bf16" else "16-mixed"
    elif wanted is not None and explicit.get(wanted) is False:
        raise ValueError(
            f"The DeepSpeed config disables {wanted}, but precision={precision!r} needs it. Set "
            f"{wanted}.enabled to 'auto' or true."
        )
    for section in ("bf16", "fp16"):
        config[section] = {**(config.get(section) or {}), "enabled": section == wanted}
    return precision


_SECTIONS = {"bf16-mixed": "bf16", "bf16-true": "bf16", "16-mixed": "fp16", "16-true": "fp16"}


def fill_batch_sizes(config: dict[str, Any], *, micro_batch_size: int | None, world_size: int) -> None:
    """Fill ``train_micro_batch_size_per_gpu``, ``gradient_accumulation_steps`` and ``train_batch_size``.

    DeepSpeed requires ``train_batch_size == micro x accumulation x world_size``; missing or
    ``"auto"`` values are derived (the micro batch from the data loader, else 1).
    """
    micro = config.get("train_micro_batch_size_per_gpu", "auto")
    accumulation = config.get("gradient_accumulation_steps", "auto")
    total = config.get("train_batch_size", "auto")
    if accumulation == "auto":
        accumulation = 1
    if micro == "auto":
        if total != "auto":
            micro = max(1, int(total) // (int(accumulation) * world_size))
        else:
            micro = micro_batch_size or 1
    if total == "auto":
        total = int(micro) * int(accumulation) * world_size
    if int(total) != int(micro) * int(accumulation) * world_size:
        raise ValueError(
            f"DeepSpeed needs train_batch_size = train_micro_batch_size_per_gpu x gradient_accumulation_steps x "
            f"world size, but {total} != {micro} x {accumulation} x {world_size}. Fix the config, or set the "
            f"values to 'auto'."
        )
    config["train_micro_batch_size_per_gpu"] = int(micro)
    config["gradient_accumulation_steps"] = int(accumulation)
    config["train_batch_size"] = int(total)


def fill_defaults(config: dict[str, Any]) -> None:
    """Settings drivetrain needs unless the user set them: torch optimizers are allowed under ZeRO and
    offload (DeepSpeed refuses them by default), quiet logs, and no gradient clipping unless asked —
    DeepSpeed 0.19 clips to a norm of 1.0 by default, which no other strategy does, so the same
    program would train differently under it."""
    config.setdefault("zero_allow_untested_optimizer", True)
    config.setdefault("zero_force_ds_cpu_optimizer", False)
    if config.get("gradient_clipping", "auto") == "auto":
        config["gradient_clipping"] = 0.0
    config.setdefault("steps_per_print", 2**31 - 1)
    leftover = sorted(_auto_keys(config))
    if leftover:
        raise ValueError(
            f"The DeepSpeed config still has 'auto' at {', '.join(leftover)}; drivetrain fills only the batch "
            f"sizes, bf16/fp16 and gradient_clipping. Give those values explicitly."
        )


def _auto_keys(config: Any, prefix: str = "") -> list[str]:
    if isinstance(config, dict):
        found = []
        for key, value in config.items():
            found += _auto_keys(value, f"{prefix}{key}.")
        return found
    return [prefix.rstrip(".")] if config == "auto" else []
