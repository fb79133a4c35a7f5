"""An import hook that makes ``import accelerate…`` give drivetrain's equivalents.

Accelerate's test scripts import from ``accelerate``, ``accelerate.utils``, ``accelerate.state``
and so on. With :func:`install`, each of those names is a small module whose attributes come from
drivetrain's public modules (:data:`MODULES`, searched in order; :data:`RENAMED` where drivetrain
spells a name differently) — the change of imports a user migrating a script makes, done for
every import at once. Two modules come from the scripts' own package: ``accelerate.test_utils``
is :mod:`shim_test_utils` (the scripts' assertion helpers, written here) and
``accelerate.test_utils.training`` is the installed package's ``training.py`` (the regression
data set and model the scripts train), run with its own imports redirected.

A name drivetrain lacks does not stop a script at its import line: it becomes a placeholder that
raises :class:`MissingEquivalent` (naming it) when used, so only the sub-tests that use it fail
and the conformance table shows where each gap is.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import logging
import sys
import types
from collections.abc import Sequence
from pathlib import Path
from typing import Any

#: accelerate module -> drivetrain modules whose public names it offers (first hit wins).
MODULES: dict[str, tuple[str, ...]] = {
    "accelerate": ("drivetrain", "drivetrain.utils"),
    "accelerate.big_modeling": ("drivetrain.big_modeling",),
    "accelerate.accelerator": ("drivetrain", "drivetrain.utils"),
    "accelerate.state": ("drivetrain", "drivetrain.utils", "drivetrain.facade"),
    "accelerate.data_loader": ("drivetrain.utils",),
    "accelerate.utils": ("drivetrain.utils",),
    "accelerate.utils.dataclasses": ("drivetrain.utils",),
    "accelerate.utils.operations": ("drivetrain.utils",),
    "accelerate.utils.constants": ("drivetrain.utils",),
    "accelerate.utils.environment": ("drivetrain.utils",),
    "accelerate.local_sgd": ("drivetrain.utils",),
    "accelerate.logging": ("drivetrain.logging",),
    "accelerate.tracking": ("drivetrain.tracking",),
    "accelerate.hooks": ("drivetrain.hooks",),
    "accelerate.parallelism_config": ("drivetrain",),
    "accelerate.utils.versions": ("drivetrain.utils",),
    "accelerate.utils.modeling": ("drivetrain.utils.modeling",),
    "accelerate.test_utils": ("shim_test_utils",),
    "accelerate.test_utils.testing": ("shim_test_utils",),
}

#: (accelerate module, name) -> (drivetrain module, name) where drivetrain uses another name.
RENAMED: dict[tuple[str, str], tuple[str, str]] = {
    ("accelerate.data_loader", "DataLoaderDispatcher"): ("drivetrain.data", "DispatchingDataLoader"),
}

#: accelerate modules taken from the installed package's files (relative to the package).
PACKAGE_FILES: dict[str, str] = {
    "accelerate.test_utils.training": "test_utils/training.py",
}

#: Accelerate's logger names -> the drivetrain logger that receives the same messages.
LOGGERS: dict[str, str] = {
    "accelerate.accelerator": "drivetrain",
}


class MissingEquivalent(NotImplementedError):
    """An accelerate name drivetrain has no equivalent for was used."""


class _MissingMeta(type):
    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        raise MissingEquivalent(cls._message)

    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        raise MissingEquivalent(cls._message)


def missing(module: str, name: str) -> type:
    """A stand-in for ``module.name``: importing it works, using it raises :class:`MissingEquivalent`."""
    message = f"{module}.{name} has no drivetrain equivalent (looked in {', '.join(MODULES[module])})"
    return _MissingMeta(name, (), {"_message": message, "__module__": module})


def is_missing(value: Any) -> bool:
    return isinstance(value, _MissingMeta)


class _AliasModule(types.ModuleType):
    """``accelerate.x``: attributes looked up in drivetrain's modules on first use."""

    def __init__(self, name: str, sources: Sequence[str]) -> None:
        super().__init__(name)
        self.__path__: list[str] = []  # a package, so that submodules import
        self._sources = tuple(sources)

    def __getattr__(self, attribute: str) -> Any:
        if attribute.startswith("__"):
            raise AttributeError(attribute)
        value = resolve(self.__name__, attribute)
        setattr(self, attribute, value)
        return value


def resolve(module: str, name: str) -> Any:
    """What ``from module import name`` gives under the hook."""
    renamed = RENAMED.get((module, name))
    if renamed is not None:
        return getattr(importlib.import_module(renamed[0]), renamed[1])
    for source in MODULES[module]:
        value = getattr(importlib.import_module(source), name, _ABSENT)
        if value is not _ABSENT:
            return value
    return missing(module, name)


_ABSENT = object()


class AccelerateRedirect(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds every ``accelerate`` module this hook knows; refuses the rest (no real accelerate runs)."""

    def __init__(self, package: Path) -> None:
        self.package = package

    def find_spec(
        self, fullname: str, path: Sequence[str] | None = None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != "accelerate" and not fullname.startswith("accelerate."):
            return None
        if fullname in PACKAGE_FILES:
            return importlib.util.spec_from_file_location(fullname, self.package / PACKAGE_FILES[fullname])
        if fullname in MODULES:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        raise ModuleNotFoundError(
            f"{fullname} is not redirected to drivetrain (tests/compat/hook.py knows {sorted(MODULES)})",
            name=fullname,
        )

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return _AliasModule(spec.name, MODULES[spec.name])

    def exec_module(self, module: types.ModuleType) -> None:
        if module.__name__ == "accelerate":
            for name, target in LOGGERS.items():
                # A handler a script adds to Accelerate's logger sees drivetrain's messages.
                logging.Logger.manager.loggerDict[name] = logging.getLogger(target)


def install(package: Path) -> AccelerateRedirect:
    """Redirect ``accelerate`` imports in this process; ``package`` is the installed accelerate package."""
    for name in [n for n in sys.modules if n == "accelerate" or n.startswith("accelerate.")]:
        del sys.modules[name]
    finder = AccelerateRedirect(package)
    sys.meta_path.insert(0, finder)
    return finder
