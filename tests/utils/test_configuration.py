"""Accelerate's enums as programs written for Accelerate use them."""

from drivetrain.utils import DistributedType

# Accelerate 1.15's DistributedType (Accelerate's test scripts compare against MULTI_NPU, MULTI_HPU …).
ACCELERATE_DISTRIBUTED_TYPES = {
    "NO",
    "MULTI_CPU",
    "MULTI_GPU",
    "MULTI_NPU",
    "MULTI_MLU",
    "MULTI_SDAA",
    "MULTI_MUSA",
    "MULTI_XPU",
    "DEEPSPEED",
    "FSDP",
    "XLA",
    "MEGATRON_LM",
    "MULTI_HPU",
    "MULTI_NEURON",
}


def test_distributed_type_has_every_member_of_accelerate() -> None:
    assert set(DistributedType.__members__) >= ACCELERATE_DISTRIBUTED_TYPES
    assert DistributedType.MULTI_NPU == "MULTI_NPU"  # a str enum: compares with its value
    assert DistributedType.MULTI_CPU in [DistributedType.MULTI_NPU, DistributedType.MULTI_CPU]
