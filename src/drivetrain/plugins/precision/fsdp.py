"""Precision under FSDP2: our precision names mapped onto ``fully_shard``'s ``MixedPrecisionPolicy``.

FSDP2 keeps the sharded parameters in their original dtype (what the optimizer steps) and
casts the gathered copy to ``param_dtype`` for forward and backward, so ``"bf16-mixed"`` costs
no extra memory for a float32 master copy. The table below is the whole mapping:

=============  ==================================  ===========================================
name           policy                              and the precision plugin
=============  ==================================  ===========================================
32-true        none                                unchanged
bf16-mixed     param bf16, reduce float32          autocast (keeps softmax/losses in float32)
16-mixed       param fp16, reduce float32          autocast + ``ShardedGradScaler`` (the
                                                   overflow check agrees across ranks)
16-true,       none (the model is built in 16      unchanged
bf16-true      bits, so its shards already are)
64-true        none                                unchanged
fp8            param bf16, reduce float32          autocast; the float8 layers cast the gathered
                                                   bf16 weights to float8 in each matmul
=============  ==================================  ===========================================
"""

from __future__ import annotations

from typing import Any

import torch

from drivetrain.plugins.precision.amp import MixedPrecision
from drivetrain.plugins.precision.precision import Precision

_PARAM_DTYPES = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16, "fp8": torch.bfloat16}


def fsdp_mixed_precision_policy(precision: Precision) -> Any | None:
    """The ``MixedPrecisionPolicy`` for ``precision``, or ``None`` when FSDP needs none.

    Gradients are reduced in float32: summing many bfloat16 shards loses the small updates
    that mixed precision is meant to keep.
    """
    param_dtype = _PARAM_DTYPES.get(precision.name)
    if param_dtype is None:
        return None
    from torch.distributed.fsdp import MixedPrecisionPolicy

    return MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)


def fsdp_precision(precision: Precision) -> Precision:
    """``precision``, adapted to sharded gradients.

    ``"16-mixed"`` gets a ``ShardedGradScaler``: a plain ``GradScaler`` checks only this rank's
    gradient shards for inf/NaN, so ranks could disagree on skipping a step and drift apart.
    Every other precision (and a user's own scaler) is returned unchanged.
    """
    if not isinstance(precision, MixedPrecision) or precision.scaler is None:
        return precision
    from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

    if isinstance(precision.scaler, ShardedGradScaler) or type(precision.scaler) is not torch.amp.GradScaler:
        return precision
    return MixedPrecision(precision.name, device=precision.device, scaler=ShardedGradScaler(precision.device))
