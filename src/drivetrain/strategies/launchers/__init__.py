"""Launchers: how the processes of a job are started."""

from drivetrain.strategies.launchers.launcher import Launcher, ProcessFailedError
from drivetrain.strategies.launchers.multiprocessing import MultiprocessingLauncher
from drivetrain.strategies.launchers.subprocess_script import SubprocessScriptLauncher

__all__ = ["Launcher", "MultiprocessingLauncher", "ProcessFailedError", "SubprocessScriptLauncher"]
