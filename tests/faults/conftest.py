"""The fault tests' fixtures."""

from faults.jobs import launch

__all__ = ["launch"]
