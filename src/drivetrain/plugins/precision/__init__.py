"""Precision plugins: casting, autocast, loss scaling and the precision-aware optimizer step.

Names (``"bf16-mixed"``, Accelerate's ``"fp16"``, Lightning's ``16``) resolve through
:func:`precision_from_name` and :data:`PrecisionRegistry`.
"""

from drivetrain.plugins.precision.amp import MixedPrecision
from drivetrain.plugins.precision.deepspeed import DeepSpeedPrecision
from drivetrain.plugins.precision.double import DoublePrecision
from drivetrain.plugins.precision.fp8 import Float8Precision
from drivetrain.plugins.precision.half import HalfPrecision
from drivetrain.plugins.precision.names import PrecisionRegistry, canonical_precision, precision_from_name
from drivetrain.plugins.precision.precision import Precision

__all__ = [
    "DeepSpeedPrecision",
    "DoublePrecision",
    "Float8Precision",
    "HalfPrecision",
    "MixedPrecision",
    "Precision",
    "PrecisionRegistry",
    "canonical_precision",
    "precision_from_name",
]
