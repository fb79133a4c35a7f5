"""The Accelerate-style front door: ``drivetrain.Accelerator`` and what its ``prepare`` returns."""

from drivetrain.facade.accelerator import Accelerator
from drivetrain.facade.state import GradientState
from drivetrain.facade.wrappers import PrecisionForward, PreparedOptimizer, PreparedScheduler

__all__ = ["Accelerator", "GradientState", "PrecisionForward", "PreparedOptimizer", "PreparedScheduler"]
