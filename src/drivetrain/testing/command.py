"""``check_plugin("package.module:Class")``: find what kind of plugin a name is and run its checks.

Used by ``drivetrain check-plugin`` and the pytest plugin. A target is ``"module:attribute"`` (a
class, a module-level instance, or a name the module registers, such as a strategy preset), a
module (every plugin class defined in it), or a registered accelerator, strategy or precision name.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from drivetrain.accelerators import Accelerator, AcceleratorRegistry
from drivetrain.plugins import CheckpointIO, ClusterEnvironment, Precision, PrecisionRegistry
from drivetrain.strategies import Strategy, StrategyRegistry
from drivetrain.testing import checks
from drivetrain.testing.report import Report

_KINDS = (Accelerator, Strategy, Precision, CheckpointIO, ClusterEnvironment)
_KIND_NAMES = ("accelerator", "strategy", "precision", "checkpoint_io", "cluster_environment")


def check_plugin(
    target: str,
    *,
    kind: str | None = None,
    fake: bool = False,
    stand_in: str | None = "auto",
    devices: int = 2,
    accelerator: str = "cpu",
    whole_programs: bool = True,
    processes: Sequence[int] | None = None,
    cli: bool = True,
    path_or_url: str | None = None,
    env: Mapping[str, str] | None = None,
    world_size: int = 2,
    timeout: float = checks.DEFAULT_TIMEOUT,
    root: str | Path | None = None,
) -> list[Report]:
    """Run the checks of every plugin ``target`` names; one report each.

    Args:
        target: what to check (see the module docstring).
        kind: ``"accelerator"``, ``"strategy"`` or ``"precision"`` for a registered name that several
            registries hold (``"xla"``); the first of them in that order otherwise.

    The other arguments are those of :func:`~drivetrain.testing.check_accelerator` and its siblings.

    Raises:
        ValueError: ``target`` names nothing the kit can check (the message says what it found), or
            a cluster environment is named without ``env``.
    """
    common: dict[str, Any] = {"whole_programs": whole_programs, "timeout": timeout, "root": root}
    programs: dict[str, Any] = {**common, "processes": processes}
    reports = []
    for found, plugin, imports in _targets(target, kind):
        if found == "accelerator":
            reports.append(
                checks.check_accelerator(plugin, devices, fake=fake, stand_in=stand_in, cli=cli, **programs)
            )
        elif found == "strategy":
            reports.append(
                checks.check_strategy(
                    plugin,
                    accelerator=accelerator,
                    devices=devices,
                    fake=fake,
                    stand_in=stand_in,
                    cli=cli,
                    imports=imports,
                    **programs,
                )
            )
        elif found == "precision":
            reports.append(checks.check_precision(plugin, accelerator=accelerator, cli=cli, **programs))
        elif found == "checkpoint_io":
            reports.append(checks.check_checkpoint_io(plugin, path_or_url, **programs))
        else:
            if not env:
                raise ValueError(
                    f"{target} is a cluster environment: give the variables its scheduler sets, e.g. "
                    f"--env MYSCHED_RANK={{rank}} --env MYSCHED_NTASKS={{world_size}} (placeholders: rank, local_rank, "
                    f"node_rank, world_size, port)."
                )
            reports.append(checks.check_cluster_environment(plugin, env, world_size=world_size, **common))
    return reports


def _kind(value: Any) -> str | None:
    """Which kind of plugin ``value`` (a class or an instance) is; ``None`` for the base classes and anything else."""
    cls = value if isinstance(value, type) else type(value)
    if cls in _KINDS:
        return None
    for base, kind in zip(_KINDS, _KIND_NAMES, strict=True):
        if issubclass(cls, base):
            return kind
    return None


def _targets(target: str, kind: str | None) -> list[tuple[str, Any, list[str]]]:
    """(kind, what to give its check, modules to import first) for each plugin ``target`` names."""
    module_name, _, attribute = target.partition(":")
    if not attribute:
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            return _registered(target, [], kind)
        found: list[tuple[str, Any, list[str]]] = []
        for name, value in vars(module).items():
            plugin_kind = (
                _kind(value) if isinstance(value, type) and value.__module__ == module_name else None
            )
            if plugin_kind is not None:
                found.append((plugin_kind, f"{module_name}:{name}", []))
        if not found:
            raise ValueError(
                f"{module_name} defines no accelerator, strategy, precision, checkpoint IO or cluster environment class."
            )
        return found
    module = importlib.import_module(module_name)
    if hasattr(module, attribute.split(".")[0]):
        plugin_kind = _kind(_attribute(module, attribute))
        if plugin_kind is None:
            raise ValueError(
                f"{target} is {_attribute(module, attribute)!r}, not a drivetrain plugin the kit can check."
            )
        return [(plugin_kind, target, [])]
    return _registered(attribute, [module_name], kind)


def _registered(name: str, imports: list[str], kind: str | None) -> list[tuple[str, Any, list[str]]]:
    """A registered name (after importing ``imports``); one several registries hold is an accelerator first."""
    for module in imports:
        importlib.import_module(module)
    for registry, found in (
        (AcceleratorRegistry, "accelerator"),
        (StrategyRegistry, "strategy"),
        (PrecisionRegistry, "precision"),
    ):
        if (kind is None or kind == found) and name in registry:
            return [(found, name, imports)]
    raise ValueError(
        f"{name!r} is neither 'module:attribute', an importable module, nor a registered "
        f"{kind or 'accelerator, strategy or precision'} name."
    )


def _attribute(module: Any, attribute: str) -> Any:
    value = module
    for part in attribute.split("."):
        value = getattr(value, part)
    return value
