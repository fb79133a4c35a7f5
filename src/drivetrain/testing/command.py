"""``check_plugin("package.module:Class")``: find what kind of plugin a name is and run its checks.

Used by ``drivetrain check-plugin`` and the pytest plugin. A target is ``"module:attribute"`` (a
class, a module-level instance, or a name the module registers, such as a strategy preset), a
module (every plugin class defined in it), or a registered accelerator, strategy or precision name.
"""

from __future__ import annotations

import difflib
import importlib
import os
import sys
import warnings
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

    A module or ``module:attribute`` is imported from the current folder too (as ``python -m``
    does), and ``path/to/file.py:Class`` from that file's folder; the kit's programs, which run in
    other processes, find it there as well.

    Raises:
        ValueError: ``target`` names nothing the kit can check (the message says what it found), or
            a cluster environment is named alone without ``env`` (in a module of several plugins it
            is left out with a warning).
    """
    target = _importable(target)
    common: dict[str, Any] = {"whole_programs": whole_programs, "timeout": timeout, "root": root}
    programs: dict[str, Any] = {**common, "processes": processes}
    reports = []
    targets = _targets(target, kind)
    for found, plugin, imports in targets:
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
                message = (
                    f"{plugin} is a cluster environment: the kit needs every variable its scheduler sets and the "
                    f"environment reads (detect() and each getter), e.g. --env MYSCHED_RANK={{rank}} "
                    f"--env MYSCHED_NTASKS={{world_size}} (env={{...}} in Python; placeholders: rank, local_rank, "
                    f"node_rank, world_size, port)."
                )
                if len(targets) == 1:
                    raise ValueError(message)
                warnings.warn(
                    f"Not checked: {message} Check it on its own with them.", UserWarning, stacklevel=2
                )
                continue
            reports.append(checks.check_cluster_environment(plugin, env, world_size=world_size, **common))
    return reports


def _importable(target: str) -> str:
    """``target`` with its module importable here and in the kit's other processes.

    The current folder goes on ``sys.path`` and ``PYTHONPATH`` (a plugin being written sits there);
    ``path/to/file.py[:attribute]`` becomes ``file[:attribute]`` with ``path/to`` added the same way.
    """
    module_name, colon, attribute = target.partition(":")
    folders = [os.getcwd()]
    if module_name.endswith(".py") or os.sep in module_name:
        file = Path(module_name).expanduser().resolve()
        if file.suffix != ".py" or not file.is_file():
            raise ValueError(
                f"{module_name} is not a Python file; give a file such as plugins/vendor.py:MyAccelerator, or a "
                f"module name (vendor:MyAccelerator) importable from here."
            )
        folders.insert(0, str(file.parent))
        module_name = file.stem
    for folder in reversed(folders):
        if folder not in sys.path:
            sys.path.insert(0, folder)
        paths = os.environ.get("PYTHONPATH", "").split(os.pathsep)
        if folder not in paths:
            os.environ["PYTHONPATH"] = os.pathsep.join([folder, *[p for p in paths if p]])
    return f"{module_name}{colon}{attribute}"


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
    if not module_name:
        raise ValueError(
            f"{target!r} names no module before the colon: write module:Class, e.g. vendor:MyAccelerator."
        )
    if not attribute:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as error:
            if error.name != module_name.split(".")[0] and error.name != module_name:
                raise  # the module itself imports something missing: that error says what
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
    module = _import(module_name)
    if hasattr(module, attribute.split(".")[0]):
        plugin_kind = _kind(_attribute(module, attribute))
        if plugin_kind is None:
            raise ValueError(
                f"{target} is {_attribute(module, attribute)!r}, not a drivetrain plugin the kit can check."
            )
        return [(plugin_kind, target, [])]
    return _registered(attribute, [module_name], kind)


def _import(module_name: str) -> Any:
    """The module, or a ValueError saying why it cannot be imported and how to make it importable."""
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        if error.name not in (module_name, module_name.split(".")[0]):
            raise  # the module imports something that is missing: that error names it
        raise ValueError(
            f"No module named {module_name!r} here ({os.getcwd()}). Run the command from the folder that holds it, "
            f"add that folder to PYTHONPATH, install its package, or give the file: path/to/{module_name}.py:Class."
        ) from None


def _registered(name: str, imports: list[str], kind: str | None) -> list[tuple[str, Any, list[str]]]:
    """A registered name (after importing ``imports``); one several registries hold is an accelerator first."""
    for module in imports:
        _import(module)
    for registry, found in (
        (AcceleratorRegistry, "accelerator"),
        (StrategyRegistry, "strategy"),
        (PrecisionRegistry, "precision"),
    ):
        if (kind is None or kind == found) and name in registry:
            return [(found, name, imports)]
    if imports:  # module:attribute, and the module neither defines nor registers the attribute
        source = sys.modules[imports[0]]
        names = [n for n in vars(source) if not n.startswith("_")]
        close = difflib.get_close_matches(name, names, n=1) or difflib.get_close_matches(
            name.lower(), [n.lower() for n in names], n=1
        )
        hint = ""
        if close:
            spelled = next(n for n in names if n.lower() == close[0].lower())
            hint = f" Did you mean {imports[0]}:{spelled}?"
        raise ValueError(
            f"{imports[0]} has no attribute {name!r} and registers no "
            f"{kind or 'accelerator, strategy or precision'} of that name.{hint}"
        )
    raise ValueError(
        f"{name!r} is neither an importable module nor a registered {kind or 'accelerator, strategy or precision'} "
        f"name. Give module:Class (e.g. vendor:MyAccelerator, importable from here) or a module, a file "
        f"(path/to/vendor.py:MyAccelerator), or a name the registries hold (drivetrain env lists them)."
    )


def _attribute(module: Any, attribute: str) -> Any:
    value = module
    for part in attribute.split("."):
        value = getattr(value, part)
    return value
