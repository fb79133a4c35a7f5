"""Launchers: how the processes of a job are started.

Each launcher is imported on first use: the Accelerator reads the launch overrides
(:mod:`~drivetrain.strategies.launchers.overrides`) when it is imported, and a one-process run
never needs the process-starting machinery.
"""

from typing import TYPE_CHECKING

from drivetrain._utilities.lazy import lazy_exports

if TYPE_CHECKING:
    from drivetrain.strategies.launchers.launcher import Launcher, ProcessFailedError
    from drivetrain.strategies.launchers.multiprocessing import MultiprocessingLauncher
    from drivetrain.strategies.launchers.subprocess_script import SubprocessScriptLauncher

__all__ = ["Launcher", "MultiprocessingLauncher", "ProcessFailedError", "SubprocessScriptLauncher"]

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "Launcher": "drivetrain.strategies.launchers.launcher",
        "ProcessFailedError": "drivetrain.strategies.launchers.launcher",
        "MultiprocessingLauncher": "drivetrain.strategies.launchers.multiprocessing",
        "SubprocessScriptLauncher": "drivetrain.strategies.launchers.subprocess_script",
    },
)
