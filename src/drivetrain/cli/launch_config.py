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
    same_network: null        # several machines: true = machine 0's address (static), false = a rendezvous there
    debug: false              # check that every collective is called alike on all ranks
    gpu_ids: all              # which GPUs of this machine (a comma-separated list of ids)
    enable_cpu_affinity: false  # bind each rank to the CPUs of its GPU's NUMA node
    main_training_function: main  # the script's function each process calls (main: run the script)
    downcast_bf16: false      # TPUs: torch_xla's XLA_DOWNCAST_BF16

Accelerate's ``dynamo_config:`` section (``dynamo_backend: INDUCTOR`` …) is read as these keys,
and its ``num_processes: -1`` as "not set".

The default file is ``$XDG_CONFIG_HOME/drivetrain/launch.yaml`` (``~/.config/drivetrain/launch.yaml``).
Keys of Accelerate's that drivetrain has no use for are accepted at their neutral values, and its
integration sections (``deepspeed_config``, ``fsdp_config``, ``ipex_config`` …) when empty or
switched off (:mod:`drivetrain.cli.accelerate_file`). Any other value for them is an error whose
advice fits the section (DeepSpeed and FSDP: the strategy the script passes); a setting is never
dropped silently.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

from drivetrain.cli import accelerate_file


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
    same_network: bool | None = None
    debug: bool | None = None
    gpu_ids: str | None = None
    enable_cpu_affinity: bool | None = None
    main_training_function: str | None = None
    downcast_bf16: bool | None = None

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
    "gpu_ids",
    "main_training_function",
}
_BOOL_KEYS = {
    "use_cpu",
    "dynamo_use_fullgraph",
    "dynamo_use_dynamic",
    "same_network",
    "debug",
    "enable_cpu_affinity",
    "downcast_bf16",
}
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
        if key == "gpu_ids" and value != "all":
            ids = [part.strip() for part in value.split(",")]
            if not all(part.isdigit() for part in ids):
                raise ValueError(
                    f"{source}: gpu_ids must be 'all' or device numbers separated by commas ('0,1'), got {value!r}."
                )
        if key == "main_training_function" and not value.isidentifier():
            raise ValueError(f"{source}: main_training_function must be a function's name, got {value!r}.")
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
    theirs: dict[str, Any] = {}
    ignored: list[str] = []
    for key, value in _with_dynamo_section(data, ignored).items():
        if key in fields:
            values[key] = check_value(key, _accelerate_spelling(key, value), str(path))
        elif accelerate_file.is_accelerate_key(key, value):
            theirs[key] = value
        else:
            raise ValueError(
                f"{path}: unknown setting {key!r}. Known: {', '.join(sorted(fields))} (and Accelerate's "
                f"{', '.join(sorted(accelerate_file.NEUTRAL_KEYS))} at their defaults, distributed_type, and its "
                f"*_config sections when empty or off)."
            )
    ignored += accelerate_file.problems(theirs)
    if ignored:
        # Not honoured here, so not accepted: a run without them would not be the run the file describes.
        listed = "".join(f"\n  - {problem}" for problem in ignored)
        raise ValueError(
            f"{path}: drivetrain launch cannot honour:{listed}\nChange or remove "
            f"{'this setting' if len(ignored) == 1 else 'these settings'} in the file and launch again."
        )
    return LaunchConfig(**values)


def _accelerate_spelling(key: str, value: Any) -> Any:
    """``value`` as drivetrain spells it, where Accelerate writes the same setting otherwise."""
    if key == "num_processes" and value == -1:
        return None  # Accelerate's "not set" (a scheduler passes the number)
    if key == "downcast_bf16" and isinstance(value, str) and value.lower() in ("yes", "no"):
        return value.lower() == "yes"
    if key == "gpu_ids" and isinstance(value, int) and not isinstance(value, bool):
        return str(value)  # YAML reads `gpu_ids: 0` as a number
    return value


def _with_dynamo_section(data: dict[str, Any], ignored: list[str]) -> dict[str, Any]:
    """``data`` with Accelerate's ``dynamo_config:`` section spread into our ``dynamo_*`` keys."""
    section = data.get("dynamo_config")
    if not isinstance(section, dict):
        return data
    flat = {key: value for key, value in data.items() if key != "dynamo_config"}
    for key, value in section.items():
        if key in _NEUTRAL_DYNAMO_KEYS:
            if value not in _NEUTRAL_DYNAMO_KEYS[key]:
                ignored.append(
                    f"dynamo_config.{key}: {value!r}: drivetrain compiles whole models; compile repeated blocks "
                    f"with torch.compile(block) in the model"
                )
        elif key in ("dynamo_backend", "dynamo_mode", "dynamo_use_fullgraph", "dynamo_use_dynamic"):
            flat.setdefault(key, value)
        else:
            ignored.append(f"dynamo_config.{key}: not a torch.compile setting drivetrain knows")
    return flat


def save(config: LaunchConfig, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(config.to_yaml())
    os.replace(temporary, path)
