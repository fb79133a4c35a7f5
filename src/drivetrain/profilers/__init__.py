"""Profilers for the Trainer: how long each hook, step and data fetch of a run takes.

``Trainer(profiler="simple")`` times every action (a summary table at the end of each entry
point), ``"advanced"`` runs ``cProfile`` per action, ``"pytorch"`` records operators with
``torch.profiler`` and writes a Chrome trace under the log folder. Pass an instance to set the
output folder and file name, or subclass :class:`Profiler` (``start``/``stop``/``summary``).
The names are Lightning's (``lightning.pytorch.profilers``).
"""

from __future__ import annotations

from drivetrain.profilers.advanced import AdvancedProfiler
from drivetrain.profilers.profiler import PassThroughProfiler, Profiler
from drivetrain.profilers.pytorch import PyTorchProfiler
from drivetrain.profilers.simple import SimpleProfiler

__all__ = ["AdvancedProfiler", "PassThroughProfiler", "Profiler", "PyTorchProfiler", "SimpleProfiler"]
