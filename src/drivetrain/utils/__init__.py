"""Accelerate-compatible helpers: ``from drivetrain.utils import set_seed`` works like ``accelerate.utils``.

Seeding (and ``SeedableRandomSampler``), the big-model helpers ``accelerate.utils`` has
(``infer_auto_device_map``, ``load_checkpoint_in_model`` …), the kwargs handlers, the configuration dataclasses and
enums, and free collective functions (which use the live ``drivetrain.Accelerator`` of the
process). Each name is imported on first use: ``from drivetrain.utils import set_seed`` loads only
what it needs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from drivetrain._utilities.lazy import lazy_exports

if TYPE_CHECKING:  # pragma: no cover - what type checkers and IDEs see for the lazy names below
    from drivetrain.big_modeling import (
        compute_module_sizes,
        infer_auto_device_map,
        load_checkpoint_in_model,
        set_module_tensor_to_device,
    )
    from drivetrain.data.prepare import skip_first_batches
    from drivetrain.data.seeding import SeedableRandomSampler
    from drivetrain.strategies.collective_errors import (
        CollectiveMismatchError as DistributedOperationException,
    )
    from drivetrain.utils.availability import (
        is_bf16_available,
        is_cuda_available,
        is_datasets_available,
        is_deepspeed_available,
        is_fp16_available,
        is_hpu_available,
        is_mlflow_available,
        is_mps_available,
        is_npu_available,
        is_pytest_available,
        is_rich_available,
        is_safetensors_available,
        is_tensorboard_available,
        is_torch_xla_available,
        is_transformers_available,
        is_wandb_available,
        is_xpu_available,
    )
    from drivetrain.utils.configuration import (
        DataLoaderConfiguration,
        DistributedType,
        GradientAccumulationPlugin,
        LoggerType,
        PrecisionType,
        ProjectConfiguration,
        RNGType,
    )
    from drivetrain.utils.data_loader import prepare_data_loader
    from drivetrain.utils.dynamo import DynamoBackend, TorchDynamoPlugin, is_compiled_module
    from drivetrain.utils.environment import patch_environment
    from drivetrain.utils.kwargs_handlers import (
        AORecipeKwargs,
        AutocastKwargs,
        DDPCommunicationHookType,
        DistributedDataParallelKwargs,
        GradScalerKwargs,
        InitProcessGroupKwargs,
        KwargsHandler,
        ProfileKwargs,
    )
    from drivetrain.utils.memory import find_executable_batch_size, release_memory, should_reduce_batch_size
    from drivetrain.utils.modeling import extract_model_from_parallel
    from drivetrain.utils.operations import (
        broadcast,
        broadcast_object_list,
        gather,
        gather_object,
        pad_across_processes,
        reduce,
        send_to_device,
        set_seed,
        synchronize_rng_state,
        synchronize_rng_states,
        wait_for_everyone,
    )

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "SeedableRandomSampler": "drivetrain.data.seeding",
        "compute_module_sizes": "drivetrain.big_modeling",
        "infer_auto_device_map": "drivetrain.big_modeling",
        "load_checkpoint_in_model": "drivetrain.big_modeling",
        "set_module_tensor_to_device": "drivetrain.big_modeling",
        "DistributedOperationException": "drivetrain.strategies.collective_errors:CollectiveMismatchError",
        "DataLoaderConfiguration": "drivetrain.utils.configuration",
        "DistributedType": "drivetrain.utils.configuration",
        "GradientAccumulationPlugin": "drivetrain.utils.configuration",
        "LoggerType": "drivetrain.utils.configuration",
        "PrecisionType": "drivetrain.utils.configuration",
        "ProjectConfiguration": "drivetrain.utils.configuration",
        "RNGType": "drivetrain.utils.configuration",
        "AORecipeKwargs": "drivetrain.utils.kwargs_handlers",
        "DynamoBackend": "drivetrain.utils.dynamo",
        "TorchDynamoPlugin": "drivetrain.utils.dynamo",
        "is_compiled_module": "drivetrain.utils.dynamo",
        "AutocastKwargs": "drivetrain.utils.kwargs_handlers",
        "DDPCommunicationHookType": "drivetrain.utils.kwargs_handlers",
        "DistributedDataParallelKwargs": "drivetrain.utils.kwargs_handlers",
        "GradScalerKwargs": "drivetrain.utils.kwargs_handlers",
        "InitProcessGroupKwargs": "drivetrain.utils.kwargs_handlers",
        "KwargsHandler": "drivetrain.utils.kwargs_handlers",
        "ProfileKwargs": "drivetrain.utils.kwargs_handlers",
        "is_bf16_available": "drivetrain.utils.availability",
        "is_cuda_available": "drivetrain.utils.availability",
        "is_datasets_available": "drivetrain.utils.availability",
        "is_deepspeed_available": "drivetrain.utils.availability",
        "is_fp16_available": "drivetrain.utils.availability",
        "is_hpu_available": "drivetrain.utils.availability",
        "is_mlflow_available": "drivetrain.utils.availability",
        "is_mps_available": "drivetrain.utils.availability",
        "is_npu_available": "drivetrain.utils.availability",
        "is_pytest_available": "drivetrain.utils.availability",
        "is_rich_available": "drivetrain.utils.availability",
        "is_safetensors_available": "drivetrain.utils.availability",
        "is_tensorboard_available": "drivetrain.utils.availability",
        "is_torch_xla_available": "drivetrain.utils.availability",
        "is_transformers_available": "drivetrain.utils.availability",
        "is_wandb_available": "drivetrain.utils.availability",
        "is_xpu_available": "drivetrain.utils.availability",
        "extract_model_from_parallel": "drivetrain.utils.modeling",
        "find_executable_batch_size": "drivetrain.utils.memory",
        "patch_environment": "drivetrain.utils.environment",
        "release_memory": "drivetrain.utils.memory",
        "should_reduce_batch_size": "drivetrain.utils.memory",
        "prepare_data_loader": "drivetrain.utils.data_loader",
        "skip_first_batches": "drivetrain.data.prepare",
        "synchronize_rng_state": "drivetrain.utils.operations",
        "synchronize_rng_states": "drivetrain.utils.operations",
        "broadcast": "drivetrain.utils.operations",
        "broadcast_object_list": "drivetrain.utils.operations",
        "gather": "drivetrain.utils.operations",
        "gather_object": "drivetrain.utils.operations",
        "pad_across_processes": "drivetrain.utils.operations",
        "reduce": "drivetrain.utils.operations",
        "send_to_device": "drivetrain.utils.operations",
        "set_seed": "drivetrain.utils.operations",
        "wait_for_everyone": "drivetrain.utils.operations",
    },
)

__all__ = [
    "AORecipeKwargs",
    "AutocastKwargs",
    "DDPCommunicationHookType",
    "DataLoaderConfiguration",
    "DistributedDataParallelKwargs",
    "DistributedOperationException",
    "DistributedType",
    "DynamoBackend",
    "GradScalerKwargs",
    "GradientAccumulationPlugin",
    "InitProcessGroupKwargs",
    "KwargsHandler",
    "LoggerType",
    "PrecisionType",
    "ProfileKwargs",
    "ProjectConfiguration",
    "RNGType",
    "SeedableRandomSampler",
    "TorchDynamoPlugin",
    "broadcast",
    "broadcast_object_list",
    "compute_module_sizes",
    "extract_model_from_parallel",
    "find_executable_batch_size",
    "gather",
    "gather_object",
    "infer_auto_device_map",
    "is_bf16_available",
    "is_compiled_module",
    "is_cuda_available",
    "is_datasets_available",
    "is_deepspeed_available",
    "is_fp16_available",
    "is_hpu_available",
    "is_mlflow_available",
    "is_mps_available",
    "is_npu_available",
    "is_pytest_available",
    "is_rich_available",
    "is_safetensors_available",
    "is_tensorboard_available",
    "is_torch_xla_available",
    "is_transformers_available",
    "is_wandb_available",
    "is_xpu_available",
    "load_checkpoint_in_model",
    "pad_across_processes",
    "patch_environment",
    "prepare_data_loader",
    "reduce",
    "release_memory",
    "send_to_device",
    "set_module_tensor_to_device",
    "set_seed",
    "should_reduce_batch_size",
    "skip_first_batches",
    "synchronize_rng_state",
    "synchronize_rng_states",
    "wait_for_everyone",
]
