"""Accelerate's ``is_*_available`` helpers: what hardware and optional packages this process has.

Hardware answers come from drivetrain's hardware accelerators (``CUDAAccelerator.is_available()``
…), packages are found without importing them. Hardware drivetrain has no plugin for (Habana
HPUs, Ascend NPUs, …) is never available here.
"""

from __future__ import annotations

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
