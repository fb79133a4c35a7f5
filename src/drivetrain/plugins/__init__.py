"""Plugins a Strategy is composed of: precision, checkpoint IO and cluster environment.

The names are imported from their subpackages on first use, so importing one kind of plugin does
not import the others.
"""

from __future__ import annotations

import importlib
from typing import Any

_SUBPACKAGE = {
    "ClusterEnvironment": "environments",
    "detect_cluster_environment": "environments",
    "KubeflowEnvironment": "environments",
    "LocalEnvironment": "environments",
    "LSFEnvironment": "environments",
    "MPIEnvironment": "environments",
    "SLURMEnvironment": "environments",
    "TorchElasticEnvironment": "environments",
    "AsyncCheckpointIO": "io",
    "CheckpointIO": "io",
    "TorchCheckpointIO": "io",
    "DeepSpeedPrecision": "precision",
    "DoublePrecision": "precision",
    "HalfPrecision": "precision",
    "MixedPrecision": "precision",
    "Precision": "precision",
    "PrecisionRegistry": "precision",
}

__all__ = sorted(_SUBPACKAGE)


def __getattr__(name: str) -> Any:
    subpackage = _SUBPACKAGE.get(name)
    if subpackage is None:
        raise AttributeError(f"module 'drivetrain.plugins' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"drivetrain.plugins.{subpackage}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
