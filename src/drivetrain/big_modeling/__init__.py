"""Big models for inference: build without memory, load checkpoints straight to their devices, offload.

Accelerate's big-model helpers, on plain torch modules::

    from drivetrain.big_modeling import init_empty_weights, load_checkpoint_and_dispatch

    with init_empty_weights():
        model = MyModel(config)                        # no memory used
    model = load_checkpoint_and_dispatch(
        model, "checkpoint_folder", device_map="auto", max_memory={0: "20GiB", "cpu": "60GiB", "disk": "1TB"},
        offload_folder="offload",
    )
    model(inputs)                                      # weights brought in from RAM/disk as needed

The forward hooks they run on are :mod:`drivetrain.big_modeling.hooks` (``drivetrain.hooks``).
"""

from drivetrain._utilities.sizes import parse_size
from drivetrain.big_modeling.device_map import (
    check_device_map,
    clean_device_map,
    infer_auto_device_map,
)
from drivetrain.big_modeling.dispatch import (
    cpu_offload,
    disk_offload,
    dispatch_model,
    get_state_dict_offloaded_model,
    load_checkpoint_and_dispatch,
    load_checkpoint_in_model,
    remove_hooks,
)
from drivetrain.big_modeling.empty_weights import init_empty_weights, init_on_device
from drivetrain.big_modeling.files import offload_state_dict
from drivetrain.big_modeling.hooks import align_module_device, has_offloaded_params
from drivetrain.big_modeling.sizes import (
    compute_module_sizes,
    compute_module_total_buffer_size,
    convert_file_size_to_int,
    dtype_byte_size,
    get_balanced_memory,
    get_max_memory,
)
from drivetrain.big_modeling.tensors import (
    find_tied_parameters,
    get_non_persistent_buffers,
    named_module_tensors,
    retie_parameters,
    set_module_tensor_to_device,
)

__all__ = [
    "align_module_device",
    "check_device_map",
    "clean_device_map",
    "compute_module_sizes",
    "compute_module_total_buffer_size",
    "convert_file_size_to_int",
    "cpu_offload",
    "disk_offload",
    "dispatch_model",
    "dtype_byte_size",
    "find_tied_parameters",
    "get_balanced_memory",
    "get_max_memory",
    "get_non_persistent_buffers",
    "get_state_dict_offloaded_model",
    "has_offloaded_params",
    "infer_auto_device_map",
    "init_empty_weights",
    "init_on_device",
    "load_checkpoint_and_dispatch",
    "load_checkpoint_in_model",
    "named_module_tensors",
    "offload_state_dict",
    "parse_size",
    "remove_hooks",
    "retie_parameters",
    "set_module_tensor_to_device",
]
