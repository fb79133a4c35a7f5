"""Plugins a Strategy is composed of: precision, checkpoint IO and cluster environment.

The names are imported from their subpackages on first use, so importing one kind of plugin does
not import the others.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from drivetrain._utilities.lazy import import_submodule, public_submodules

if TYPE_CHECKING:  # pragma: no cover - what type checkers and IDEs see for the lazy names below
    from drivetrain.plugins.environments import (
        ClusterEnvironment,
        KubeflowEnvironment,
        LocalEnvironment,
        LSFEnvironment,
        MPIEnvironment,
        SLURMEnvironment,
        TorchElasticEnvironment,
        detect_cluster_environment,
    )
    from drivetrain.plugins.io import AsyncCheckpointIO, CheckpointIO, TorchCheckpointIO
    from drivetrain.plugins.precision import (
        DeepSpeedPrecision,
        DoublePrecision,
        Float8Precision,
        HalfPrecision,
        MixedPrecision,
        Precision,
        PrecisionRegistry,
    )

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
    "DamagedCheckpointError": "io",
    "UnsafeCheckpointError": "io",
    "TorchCheckpointIO": "io",
    "DeepSpeedPrecision": "precision",
    "DoublePrecision": "precision",
    "Float8Precision": "precision",
    "HalfPrecision": "precision",
    "MixedPrecision": "precision",
    "Precision": "precision",
    "PrecisionRegistry": "precision",
}

__all__ = [
    "AsyncCheckpointIO",
    "CheckpointIO",
    "ClusterEnvironment",
    "DeepSpeedPrecision",
    "DoublePrecision",
    "Float8Precision",
    "HalfPrecision",
    "KubeflowEnvironment",
    "LSFEnvironment",
    "LocalEnvironment",
    "MPIEnvironment",
    "MixedPrecision",
    "Precision",
    "PrecisionRegistry",
    "SLURMEnvironment",
    "TorchCheckpointIO",
    "TorchElasticEnvironment",
    "detect_cluster_environment",
]


def __getattr__(name: str) -> Any:
    subpackage = _SUBPACKAGE.get(name)
    if subpackage is None:
        from drivetrain.plugins.retired_names import RETIRED_PLUGIN_CLASSES

        if name in RETIRED_PLUGIN_CLASSES:
            # An ImportError (not AttributeError) keeps the message in `from drivetrain.plugins import X`.
            raise ImportError(RETIRED_PLUGIN_CLASSES[name], name=name)

        submodule = import_submodule(__name__, name)
        if submodule is not None:
            return submodule
        raise AttributeError(f"module 'drivetrain.plugins' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"drivetrain.plugins.{subpackage}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__) | public_submodules(__name__))
