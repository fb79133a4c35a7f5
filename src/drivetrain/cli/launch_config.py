"""The launch configuration file: what ``drivetrain config`` writes and ``drivetrain launch`` reads.

A YAML mapping with Accelerate's key names, so an ``accelerate config`` file works too
(``drivetrain launch --config_file ~/.cache/huggingface/accelerate/default_config.yaml``)::

    num_processes: 2          # in total, over all machines
    num_machines: 1
    machine_rank: 0
    main_process_ip: null     # machine 0's address (several machines)
    main_process_port: null
    rdzv_backend: static
    mixed_precision: bf16     # no / fp16 / bf16, or any drivetrain precision name
    gradient_accumulation_steps: 1
    use_cpu: false
    accelerator: auto         # drivetrain's: any registered accelerator name
    dynamo_backend: null      # torch.compile the Accelerator's models: inductor, aot_eager, eager …
    dynamo_mode: null         # default, reduce-overhead, max-autotune …
    dynamo_use_fullgraph: null
    dynamo_use_dynamic: null

Accelerate's ``dynamo_config:`` section (``dynamo_backend: INDUCTOR`` …) is read as these keys.

The default file is ``$XDG_CONFIG_HOME/drivetrain/launch.yaml`` (``~/.config/drivetrain/launch.yaml``).
Keys of Accelerate's that drivetrain has no use for are accepted at their neutral values; any
other value for them, and Accelerate's ``deepspeed_config``/``fsdp_config``/… sections, are an
error (a setting is never dropped silently: choose the strategy in the script).
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

#: Accelerate keys that change nothing here at these values (what ``accelerate config`` writes
#: for a plain run); another value is reported, since drivetrain would not honour it.
NEUTRAL_KEYS: dict[str, tuple[Any, ...]] = {
    "compute_environment": ("LOCAL_MACHINE",),
    "debug": (False,),
    "downcast_bf16": ("no", False),
    "enable_cpu_affinity": (False,),
    "gpu_ids": ("all", None),
    "main_training_function": ("main",),
    "same_network": (True,),
    "tpu_env": ([],),
    "tpu_use_cluster": (False,),
    "tpu_use_sudo": (False,),
    "distributed_type": ("NO", "MULTI_CPU", "MULTI_GPU", "MULTI_XPU", "MULTI_MPS"),
}


@dataclasses.dataclass
class LaunchConfig:
    """Launch settings; ``None`` means "not set here" (the command line or the default decides)."""

    num_processes: int | None = None
    num_machines: int | None = None
    machine_rank: int | None = None
    main_process_ip: str | None = None
    main_process_port: int | None = None
    rdzv_backend: str | None = None
    mixed_precision: str | None = None
    gradient_accumulation_steps: int | None = None
    use_cpu: bool | None = None
    accelerator: str | None = None
    dynamo_backend: str | None = None
    dynamo_mode: str | None = None
    dynamo_use_fullgraph: bool | None = None
    dynamo_use_dynamic: bool | None = None

    def to_yaml(self) -> str:
        import yaml  # only when a file is written: `drivetrain launch` without one never needs it

        return yaml.safe_dump(dataclasses.asdict(self), sort_keys=False)


_INT_KEYS = {
    "num_processes",
    "num_machines",
    "machine_rank",
    "main_process_port",
    "gradient_accumulation_steps",
}
_STR_KEYS = {
    "main_process_ip",
    "rdzv_backend",
    "mixed_precision",
    "accelerator",
    "dynamo_backend",
    "dynamo_mode",
}
_BOOL_KEYS = {"use_cpu", "dynamo_use_fullgraph", "dynamo_use_dynamic"}
#: Accelerate's ``dynamo_config`` keys that change nothing at these values.
_NEUTRAL_DYNAMO_KEYS: dict[str, tuple[Any, ...]] = {"dynamo_use_regional_compilation": (False, None)}


def default_path() -> Path:
    """Where ``drivetrain config`` writes and ``drivetrain launch`` looks when no file is named."""
    home = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(home) / "drivetrain" / "launch.yaml"


def check_value(key: str, value: Any, source: str) -> Any:
    """``value`` for ``key`` if it has the right type and range; else a ``ValueError`` naming ``source``."""
    if value is None:
        return None
    if key in _INT_KEYS:
        minimum = 0 if key == "machine_rank" else 1
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise ValueError(f"{source}: {key} must be an integer >= {minimum}, got {value!r}.")
        if key == "main_process_port" and value > 65535:
            raise ValueError(f"{source}: main_process_port must be a port number (1-65535), got {value}.")
    elif key in _STR_KEYS:
        if not isinstance(value, str) or not value.strip():
            raise ValueError(f"{source}: {key} must be a non-empty string, got {value!r}.")
        if key == "mixed_precision":
            from drivetrain.plugins.precision import canonical_precision

            try:
                canonical_precision(value)
            except ValueError as error:
                raise ValueError(f"{source}: mixed_precision: {error}") from None
        if key == "dynamo_mode":
            from drivetrain.utils.dynamo import COMPILE_MODES

            if value not in COMPILE_MODES:
                raise ValueError(
                    f"{source}: dynamo_mode must be one of {', '.join(COMPILE_MODES)}, got {value!r}."
                )
    elif key in _BOOL_KEYS and not isinstance(value, bool):
        raise ValueError(f"{source}: {key} must be true or false, got {value!r}.")
    return value


def load(path: Path) -> LaunchConfig:
    """Read and check a launch configuration file.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        ValueError: not a YAML mapping, an unknown key, or a value of the wrong kind.
    """
    import yaml  # only when there is a file to read (most launches have none)

    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as error:
        raise ValueError(f"{path} is not valid YAML: {error}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ValueError(f"{path} must hold a mapping of settings (key: value), got {type(data).__name__}.")
    fields = {field.name for field in dataclasses.fields(LaunchConfig)}
    values: dict[str, Any] = {}
    ignored: list[str] = []
    for key, value in _with_dynamo_section(data, ignored).items():
        if key in fields:
            values[key] = check_value(key, value, str(path))
        elif key in NEUTRAL_KEYS:
            if value not in NEUTRAL_KEYS[key]:
                ignored.append(f"{key}: {value!r}")
        elif isinstance(value, dict) and key.endswith("_config"):
            # Accelerate's deepspeed_config / fsdp_config / megatron_lm_config … sections.
            ignored.append(
                f"{key} (choose the strategy in the script: strategy='deepspeed_stage_2', 'fsdp' …)"
            )
        else:
            raise ValueError(
                f"{path}: unknown setting {key!r}. Known: {', '.join(sorted(fields))} (and Accelerate's "
                f"{', '.join(sorted(NEUTRAL_KEYS))} at their defaults)."
            )
    if ignored:
        # Not honoured here, so not accepted: a run without them would not be the run the file describes.
        raise ValueError(
            f"{path}: drivetrain launch cannot honour {'; '.join(ignored)}. Remove them from the file (the script "
            f"chooses its strategy and precision options)."
        )
    return LaunchConfig(**values)


def _with_dynamo_section(data: dict[str, Any], ignored: list[str]) -> dict[str, Any]:
    """``data`` with Accelerate's ``dynamo_config:`` section spread into our ``dynamo_*`` keys."""
    section = data.get("dynamo_config")
    if not isinstance(section, dict):
        return data
    flat = {key: value for key, value in data.items() if key != "dynamo_config"}
    for key, value in section.items():
        if key in _NEUTRAL_DYNAMO_KEYS:
            if value not in _NEUTRAL_DYNAMO_KEYS[key]:
                ignored.append(f"dynamo_config.{key}: {value!r}")
        elif key in ("dynamo_backend", "dynamo_mode", "dynamo_use_fullgraph", "dynamo_use_dynamic"):
            flat.setdefault(key, value)
        else:
            ignored.append(f"dynamo_config.{key}")
    return flat


def save(config: LaunchConfig, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(config.to_yaml())
    os.replace(temporary, path)
