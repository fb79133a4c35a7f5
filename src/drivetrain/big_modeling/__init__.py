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
"""

from drivetrain.big_modeling.device_map import (
    check_device_map,
    clean_device_map,
    compute_module_sizes,
    get_max_memory,
    infer_auto_device_map,
    parse_size,
)
from drivetrain.big_modeling.dispatch import (
    cpu_offload,
    disk_offload,
    dispatch_model,
    load_checkpoint_and_dispatch,
    load_checkpoint_in_model,
    remove_hooks,
    set_module_tensor_to_device,
)
from drivetrain.big_modeling.empty_weights import init_empty_weights, init_on_device

__all__ = [
    "check_device_map",
    "clean_device_map",
    "compute_module_sizes",
    "cpu_offload",
    "disk_offload",
    "dispatch_model",
    "get_max_memory",
    "infer_auto_device_map",
    "init_empty_weights",
    "init_on_device",
    "load_checkpoint_and_dispatch",
    "load_checkpoint_in_model",
    "parse_size",
    "remove_hooks",
    "set_module_tensor_to_device",
]
