"""Accelerate's ``is_*_available`` helpers: what hardware and optional packages this process has.

Hardware answers come from drivetrain's hardware accelerators (``CUDAAccelerator.is_available()``
…), packages are found without importing them. Hardware drivetrain has no plugin for (Habana
HPUs, Ascend NPUs, …) is never available here.
"""

from __future__ import annotations

from collections.abc import Callable

from drivetrain._utilities.imports import package_available


def is_cuda_available() -> bool:
    """Whether a CUDA GPU is usable."""
    from drivetrain.accelerators import CUDAAccelerator

    return CUDAAccelerator.is_available()


def is_xpu_available(check_device: bool = False) -> bool:
    """Whether an Intel XPU is usable."""
    from drivetrain.accelerators import XPUAccelerator

    return XPUAccelerator.is_available()


def is_mps_available(min_version: str = "1.12") -> bool:
    """Whether Apple's MPS device is usable."""
    from drivetrain.accelerators import MPSAccelerator

    return MPSAccelerator.is_available()


def is_torch_xla_available(check_is_tpu: bool = False, check_is_gpu: bool = False) -> bool:
    """Whether torch_xla and an XLA device are usable."""
    from drivetrain.accelerators import XLAAccelerator

    return XLAAccelerator.is_available()


def is_hpu_available(init_hccl: bool = False) -> bool:
    """Habana Gaudi: drivetrain has no plugin for it, so never."""
    return False


def is_npu_available(check_device: bool = False) -> bool:
    """Ascend NPUs: drivetrain has no plugin for them, so never."""
    return False


def is_bf16_available(ignore_tpu: bool = False) -> bool:
    """Whether bfloat16 compute is supported on this process's best device (always on CPUs)."""
    import torch

    if is_torch_xla_available():
        return not ignore_tpu
    if is_cuda_available():
        return bool(torch.cuda.is_bf16_supported())
    return True


def is_fp16_available() -> bool:
    """Whether float16 compute is supported (every device drivetrain runs on has it)."""
    return True


def is_deepspeed_available() -> bool:
    return package_available("deepspeed")


def is_datasets_available() -> bool:
    return package_available("datasets")


def is_transformers_available() -> bool:
    return package_available("transformers")


def is_pytest_available() -> bool:
    return package_available("pytest")


def is_safetensors_available() -> bool:
    return package_available("safetensors")


def is_tensorboard_available() -> bool:
    return package_available("tensorboard") or package_available("tensorboardX")


def is_wandb_available() -> bool:
    return package_available("wandb")


def is_mlflow_available() -> bool:
    return package_available("mlflow")


def is_rich_available() -> bool:
    return package_available("rich")


def is_mlu_available(check_device: bool = False) -> bool:
    """Cambricon MLUs: drivetrain has no plugin for them, so never."""
    return False


def is_musa_available(check_device: bool = False) -> bool:
    """Moore Threads GPUs: drivetrain has no plugin for them, so never."""
    return False


def is_sdaa_available(check_device: bool = False) -> bool:
    """Tecorigin SDAAs: drivetrain has no plugin for them, so never."""
    return False


def is_neuron_available(check_device: bool = False) -> bool:
    """AWS Neuron cores: drivetrain has no plugin for them, so never."""
    return False


def is_rocm_available() -> bool:
    """Whether torch is a ROCm build with an AMD GPU usable (through the CUDA accelerator)."""
    import torch

    return torch.version.hip is not None and is_cuda_available()


def is_weights_only_available() -> bool:
    """Whether ``torch.load(weights_only=True)`` exists (every torch drivetrain supports has it)."""
    return True


def is_fp8_available() -> bool:
    """Whether ``mixed_precision="fp8"`` can run here: drivetrain's FP8 goes through torchao."""
    return package_available("torchao")


def is_torchdata_stateful_dataloader_available() -> bool:
    """Whether torchdata's ``StatefulDataLoader`` (torchdata >= 0.8) is installed."""
    if not package_available("torchdata"):
        return False
    from importlib.metadata import PackageNotFoundError, version

    try:
        major, minor = (int(part) for part in version("torchdata").split(".")[:2])
    except (PackageNotFoundError, ValueError):
        return False
    return (major, minor) >= (0, 8)


def _installed(package: str, doc: str) -> Callable[[], bool]:
    def check() -> bool:
        return package_available(package)

    check.__doc__ = doc
    return check


# Accelerate's helpers that only ask whether a package is installed (found without importing it).
is_schedulefree_available = _installed("schedulefree", "Whether the schedulefree optimizers are installed.")
is_comet_ml_available = _installed("comet_ml", "Whether comet_ml is installed.")
is_aim_available = _installed("aim", "Whether Aim is installed.")
is_clearml_available = _installed("clearml", "Whether ClearML is installed.")
is_dvclive_available = _installed("dvclive", "Whether DVCLive is installed.")
is_swanlab_available = _installed("swanlab", "Whether SwanLab is installed.")
is_trackio_available = _installed("trackio", "Whether trackio is installed.")
is_boto3_available = _installed("boto3", "Whether boto3 is installed.")
is_pandas_available = _installed("pandas", "Whether pandas is installed.")
is_matplotlib_available = _installed("matplotlib", "Whether matplotlib is installed.")
is_peft_available = _installed("peft", "Whether PEFT is installed.")
is_timm_available = _installed("timm", "Whether timm is installed.")
is_torchvision_available = _installed("torchvision", "Whether torchvision is installed.")
is_torchdata_available = _installed("torchdata", "Whether torchdata is installed.")
is_torchao_available = _installed("torchao", "Whether torchao is installed.")
is_triton_available = _installed("triton", "Whether Triton is installed.")
is_bnb_available = _installed("bitsandbytes", "Whether bitsandbytes is installed.")
is_pynvml_available = _installed("pynvml", "Whether pynvml is installed.")
is_lomo_available = _installed("lomo_optim", "Whether the LOMO optimizers are installed.")
