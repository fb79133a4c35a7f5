"""What the keys of an ``accelerate config`` file mean to ``drivetrain launch``.

Accelerate writes every key of its ``ClusterConfig`` into the file, most at values that change
nothing for the run (``tpu_use_sudo: false``), and keeps one section per integration
(``deepspeed_config``, ``fsdp_config``, ``ipex_config`` …), empty or switched off unless the user
chose it. This module sorts them:

* keys drivetrain's :class:`~drivetrain.cli.launch_config.LaunchConfig` has are read as such;
* :data:`NEUTRAL_KEYS` at their neutral values are accepted and change nothing;
* a section that is empty or switched off (every value false, ``none`` or empty) is accepted;
* anything else is a problem with advice that fits it: DeepSpeed and FSDP are chosen by the
  script (``strategy='deepspeed_stage_2'`` …), so the advice names the strategy the section
  describes.
"""

from __future__ import annotations

from typing import Any

#: Accelerate keys that change nothing here at these values (what ``accelerate config`` writes
#: for a plain run); another value is reported, since drivetrain would not honour it.
NEUTRAL_KEYS: dict[str, tuple[Any, ...]] = {
    "compute_environment": ("LOCAL_MACHINE",),
    "tpu_env": ([], None),
    "tpu_use_cluster": (False, None),
    "tpu_use_sudo": (False, None),
    "tpu_name": (None,),
    "tpu_zone": (None,),
    "tpu_vm": (None, []),
    "commands": (None, []),
    "command_file": (None,),
    "use_mps_device": (False, None),  # Accelerate < 0.20: MPS is chosen by the accelerator now
}

#: ``distributed_type`` values that only say how many processes of which kind: the number of
#: processes and the accelerator come from their own keys.
PLAIN_DISTRIBUTED_TYPES = (
    "NO",
    "MULTI_CPU",
    "MULTI_GPU",
    "MULTI_XPU",
    "MULTI_MPS",
    "MULTI_HPU",
    "MULTI_NPU",
    "MULTI_MLU",
    "MULTI_SDAA",
    "MULTI_MUSA",
    "MULTI_NEURON",
)

#: Accelerate's integration sections and the ``distributed_type`` that switches each on.
SECTIONS: dict[str, str | None] = {
    "deepspeed_config": "DEEPSPEED",
    "fsdp_config": "FSDP",
    "megatron_lm_config": "MEGATRON_LM",
    "parallelism_config": None,
    "mpirun_config": None,
    "ipex_config": None,
    "fp8_config": None,
}

_OFF_VALUES: tuple[Any, ...] = (False, None, "", "no", "none", "NO", "None", "false", [], {})


def is_off(section: Any) -> bool:
    """Whether an integration section is absent, empty, or every value in it is an "off" value."""
    if section is None or section == {}:
        return True
    if not isinstance(section, dict):
        return False
    return all(
        any(value == off and type(value) is type(off) for off in _OFF_VALUES) for value in section.values()
    )


def _deepspeed_advice(section: dict[str, Any]) -> str:
    config_file = section.get("deepspeed_config_file")
    if config_file not in (None, "", "none"):
        return f"drivetrain.Accelerator(strategy=DeepSpeedStrategy(config={config_file!r})) (from drivetrain.strategies)"
    stage = section.get("zero_stage")
    offload = any(
        section.get(key) not in (None, "none", "")
        for key in ("offload_optimizer_device", "offload_param_device")
    )
    if stage in (2, 3):
        name = f"deepspeed_stage_{stage}" + ("_offload" if offload else "")
    elif stage == 1:
        name = "deepspeed_stage_1"
    else:
        name = "deepspeed"
    return f"drivetrain.Accelerator(strategy={name!r}) or Trainer(strategy={name!r}) (DeepSpeedStrategy(...) for the other settings)"


def _fsdp_advice(section: dict[str, Any]) -> str:
    name = "fsdp_cpu_offload" if section.get("fsdp_offload_params") is True else "fsdp"
    return f"drivetrain.Accelerator(strategy={name!r}) or Trainer(strategy={name!r}) (FSDPStrategy(...) for the wrapping policy, state-dict type and the other settings)"


def _section_advice(key: str, section: Any) -> str:
    values = section if isinstance(section, dict) else {}
    if key == "deepspeed_config":
        return f"DeepSpeed is chosen by the script in drivetrain: {_deepspeed_advice(values)}"
    if key == "fsdp_config":
        return f"FSDP is chosen by the script in drivetrain: {_fsdp_advice(values)}"
    if key == "megatron_lm_config":
        return (
            "drivetrain has no Megatron-LM integration: tensor and pipeline layouts are the script's "
            "(strategy='model_parallel', or drivetrain.ParallelismConfig)"
        )
    if key == "parallelism_config":
        return "the parallel layout is the script's: drivetrain.Accelerator(parallelism_config=drivetrain.ParallelismConfig(...))"
    if key == "mpirun_config":
        return (
            "drivetrain launch starts processes with torchrun; to start them with MPI run `mpirun -np N "
            "-hostfile FILE python train.py` yourself (drivetrain reads MPI's variables)"
        )
    if key == "ipex_config":
        return "drivetrain has no Intel Extension for PyTorch integration (torch's own CPU and XPU support is used)"
    if key == "fp8_config":
        return "FP8 is chosen by the script: drivetrain.Accelerator(mixed_precision='fp8') or Trainer(precision='fp8')"
    return "choose the setting in the script"


def is_accelerate_key(key: str, value: Any) -> bool:
    """Whether ``key`` is one of Accelerate's that :func:`problems` judges (else: an unknown setting)."""
    return (
        key in NEUTRAL_KEYS
        or key == "distributed_type"
        or key in SECTIONS
        or (key.endswith("_config") and (isinstance(value, dict) or value is None))
    )


def problems(data: dict[str, Any]) -> list[str]:
    """What in ``data`` (Accelerate's keys of a parsed file: :func:`is_accelerate_key`) cannot be honoured.

    Each entry names the key (with its value where short) and says what to do instead.
    """
    found: list[str] = []
    distributed_type = data.get("distributed_type")
    for key, value in data.items():
        if key in NEUTRAL_KEYS:
            if value not in NEUTRAL_KEYS[key]:
                found.append(f"{key}: {value!r}: a TPU-pod or cloud setting drivetrain launch does not use")
        elif key == "distributed_type":
            if value in PLAIN_DISTRIBUTED_TYPES or SECTIONS.get(f"{str(value).lower()}_config") == value:
                continue  # DEEPSPEED / FSDP / MEGATRON_LM: reported with their section below
            if value == "XLA":
                found.append(
                    "distributed_type: XLA: TPUs are the script's accelerator in drivetrain "
                    "(Accelerator(accelerator='tpu')), or drivetrain launch --accelerator tpu"
                )
            else:
                found.append(f"distributed_type: {value!r}: not a kind of run drivetrain launch knows")
        elif key in SECTIONS:
            switched_on = SECTIONS[key] is not None and distributed_type == SECTIONS[key]
            if switched_on or not is_off(value):
                switch = f"distributed_type: {SECTIONS[key]} with " if switched_on else ""
                found.append(f"{switch}{key}: {_section_advice(key, value)}")
        elif not is_off(value):
            found.append(f"{key}: an Accelerate section drivetrain does not know")
    for key, kind in SECTIONS.items():
        if kind is not None and distributed_type == kind and key not in data:
            found.append(f"distributed_type: {kind}: {_section_advice(key, {})}")
    return found
