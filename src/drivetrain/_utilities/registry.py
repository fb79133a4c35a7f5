"""One generic registry of named presets, shared by every plugin kind.

A registry maps a short name (``"ddp"``, ``"xpu"``, ``"bf16-mixed"``) to a class, the keyword
arguments it is built with, and a description. Built-in classes register themselves; users
register their own classes the same way, and third-party packages through an entry-point group.

Rules for names that are already taken:

* the same class registered again under the same name replaces its entry silently (a script
  re-imported by a spawned process defines its classes a second time);
* a user class taking a name that a built-in holds replaces the built-in, with a warning;
* a user class taking a name that another user class holds is an error unless ``override=True``.
"""

from __future__ import annotations

import difflib
import sys
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Generic, TypeVar

T = TypeVar("T")

_BUILTIN_PREFIX = "drivetrain."


class UnknownNameError(KeyError, ValueError):
    """A name no registry entry has.

    A ``ValueError``, as every bad user input here, and a ``KeyError``, as Lightning's dict-based
    registries raise for ``StrategyRegistry["nope"]``: code written for either catches it.
    """

    def __str__(self) -> str:
        # KeyError's str() is the repr of its argument; this error carries a sentence.
        return str(self.args[0]) if self.args else ""


class RetiredNameError(UnknownNameError):
    """A name no registry entry has, that once meant something: the message tells its history and what to use now.

    Names Lightning retired (``"dp"``, ``"horovod"``, ``"ipu"`` …) and third-party strategies no installed
    package registers (``"colossalai"`` …) get this instead of a "did you mean" guess.
    """


def did_you_mean(name: object, choices: Iterable[str]) -> str:
    """``" Did you mean 'ddp'?"`` for the choice closest to ``name``, or ``""`` when none is close."""
    if not isinstance(name, str):
        return ""
    by_lower = {choice.lower(): choice for choice in choices}
    match = difflib.get_close_matches(name.strip().lower(), list(by_lower), n=1, cutoff=0.6)
    return f" Did you mean {by_lower[match[0]]!r}?" if match else ""


@dataclass(frozen=True)
class RegistryEntry:
    """What a registry knows about one name."""

    name: str
    cls: type
    description: str = ""
    init_kwargs: dict[str, Any] = field(default_factory=dict)

    @property
    def is_builtin(self) -> bool:
        return _is_builtin(self.cls)


def _is_builtin(cls: type) -> bool:
    return cls.__module__.startswith(_BUILTIN_PREFIX)


def _class_identity(cls: type) -> tuple[str, str | None]:
    # A class defined in a script is re-created when a spawned child re-imports the script as
    # ``__mp_main__``: it is the same class for our purposes if the name and the file agree.
    module = sys.modules.get(cls.__module__)
    return cls.__qualname__, getattr(module, "__file__", None)


class Registry(Generic[T]):
    """Name → (class, default init kwargs, description) for one kind of plugin.

    Args:
        kind: what the registry holds, for messages (``"accelerator"``, ``"strategy"`` …).
        entry_point_group: the ``importlib.metadata`` entry-point group that third-party packages
            use to register themselves; read lazily, once, on first lookup.
        builtin_modules: modules whose classes register built-in entries when imported; imported
            on first lookup, so that importing the package does not import every implementation.
        retired: names that are not registered but once meant something (retired by Lightning,
            or provided by a third-party package), each with the sentence that explains it and
            names the replacement; asking for one raises :class:`RetiredNameError` with it. A
            registered entry of that name (a package that provides it) wins.
    """

    def __init__(
        self,
        kind: str,
        entry_point_group: str | None = None,
        builtin_modules: tuple[str, ...] = (),
        retired: Mapping[str, str] | None = None,
    ) -> None:
        self.kind = kind
        self.entry_point_group = entry_point_group
        self._retired = dict(retired or {})
        self._entries: dict[str, RegistryEntry] = {}
        self._builtin_modules = builtin_modules
        self._builtins_loaded = not builtin_modules
        self._entry_points_loaded = entry_point_group is None and not builtin_modules

    # -- registration -----------------------------------------------------------------------
    def register(
        self,
        name: str,
        cls: type | None = None,
        description: str = "",
        override: bool = False,
        **init_kwargs: Any,
    ) -> Any:
        """Register ``cls`` under ``name``; without ``cls``, return a class decorator."""
        if not isinstance(name, str) or not name:
            raise TypeError(f"A {self.kind} name must be a non-empty string, got {name!r}.")
        if cls is None:

            def decorator(decorated: type) -> type:
                self.register(name, decorated, description, override, **init_kwargs)
                return decorated

            return decorator
        if not isinstance(cls, type):
            raise TypeError(
                f"register({name!r}, ...) expects a class as its second argument, got {cls!r}. "
                f"Pass the class itself (not an instance); its init kwargs go in as keyword arguments."
            )
        if not _is_builtin(cls):
            # A user's class replaces a built-in of the same name (with a warning): the built-ins
            # must be in place first, not registered later over it.
            self._load_builtins()
        existing = self._entries.get(name)
        if existing is not None and not override and _class_identity(existing.cls) != _class_identity(cls):
            if existing.is_builtin and not _is_builtin(cls):
                warnings.warn(
                    f"{cls.__qualname__} replaces the built-in {self.kind} {name!r} "
                    f"({existing.cls.__qualname__}). Register under another name to keep both.",
                    UserWarning,
                    stacklevel=3,
                )
            elif not existing.is_builtin or _is_builtin(cls):
                raise ValueError(
                    f"The {self.kind} name {name!r} is already registered to "
                    f"{existing.cls.__module__}.{existing.cls.__qualname__}. Choose another name, "
                    f"or pass override=True to replace it."
                )
        self._entries[name] = RegistryEntry(name, cls, description, dict(init_kwargs))
        return cls

    def remove(self, name: str) -> None:
        """Forget ``name``; an unknown name is an error listing the known ones."""
        self._load_entry_points()
        if name not in self._entries:
            raise self._unknown(name)
        del self._entries[name]

    # -- lookup -----------------------------------------------------------------------------
    def get(self, name: str, default: Any = None, **overrides: Any) -> T:
        """Build the class registered under ``name`` with its stored kwargs (plus ``overrides``).

        Args:
            name: a registered name.
            default: returned instead of an error for an unknown name, when given (Lightning's
                ``get(name, default)``).
            overrides: constructor arguments on top of the registered ones.
        """
        if default is not None and name not in self:
            return default
        entry = self.entry(name)
        kwargs = {**entry.init_kwargs, **overrides}
        return entry.cls(**kwargs)

    def __getitem__(self, name: str) -> Mapping[str, Any]:
        """Lightning's dict-style view of one entry (read-only).

        ``StrategyRegistry["ddp"]`` is ``{"strategy": DDPStrategy, "strategy_name": "ddp",
        "description": ..., "init_params": {...}}``; an accelerator's has ``"accelerator"`` and
        ``"accelerator_name"``. Register and remove through :meth:`register` and :meth:`remove`.
        """
        entry = self.entry(name)
        return MappingProxyType(
            {
                self.kind: entry.cls,
                f"{self.kind}_name": entry.name,
                "description": entry.description,
                "init_params": MappingProxyType(dict(entry.init_kwargs)),
            }
        )

    def keys(self) -> list[str]:
        """The registered names, sorted (as a dict's keys)."""
        return self.available()

    def values(self) -> list[Mapping[str, Any]]:
        """The dict-style view (see :meth:`__getitem__`) of every entry, by name."""
        return [self[name] for name in self.available()]

    def items(self) -> list[tuple[str, Mapping[str, Any]]]:
        """``(name, view)`` pairs, by name."""
        return [(name, self[name]) for name in self.available()]

    def entry(self, name: str) -> RegistryEntry:
        """The :class:`RegistryEntry` for ``name``; unknown names list what is available."""
        if name not in self._entries:
            self._load_entry_points()
        try:
            return self._entries[name]
        except KeyError:
            raise self._unknown(name) from None

    def available(self) -> list[str]:
        """The registered names, sorted."""
        self._load_entry_points()
        return sorted(self._entries)

    def describe(self) -> list[RegistryEntry]:
        """All entries, sorted by name."""
        return [self._entries[name] for name in self.available()]

    @contextmanager
    def restored(self) -> Iterator[None]:
        """Undo, when the block ends, every registration and removal made inside it (for checks and tests)."""
        self._load_entry_points()
        saved = dict(self._entries)
        try:
            yield
        finally:
            self._entries.clear()
            self._entries.update(saved)

    def __contains__(self, name: object) -> bool:
        if name not in self._entries:
            self._load_entry_points()
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.available())

    def __len__(self) -> int:
        return len(self.available())

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.kind!r}, {self.available()})"

    # -- internals --------------------------------------------------------------------------
    def retired(self, name: str) -> str | None:
        """Why ``name`` is not registered and what to use instead, for a retired or third-party name; else ``None``."""
        return self._retired.get(name.strip().lower()) if isinstance(name, str) else None

    def _unknown(self, name: object) -> UnknownNameError:
        history = self.retired(name) if isinstance(name, str) else None
        if history is not None:
            return RetiredNameError(history)
        available = self.available()
        return UnknownNameError(
            f"Unknown {self.kind} {name!r}.{did_you_mean(name, available)} Available: "
            f"{', '.join(available) or '(none)'}. Register your own with "
            f"{self.kind.capitalize()}Registry.register(name, cls)."
        )

    def _load_builtins(self) -> None:
        if self._builtins_loaded:
            return
        self._builtins_loaded = True
        import importlib

        for module in self._builtin_modules:
            importlib.import_module(module)

    def _load_entry_points(self) -> None:
        if self._entry_points_loaded:
            return
        self._entry_points_loaded = True
        self._load_builtins()
        if self.entry_point_group is None:
            return
        from importlib.metadata import entry_points

        for entry_point in entry_points(group=self.entry_point_group or ""):
            try:
                loaded = entry_point.load()
                _call_registration_hook(loaded, self)
            except Exception as error:  # a broken plugin package must not break everything else
                warnings.warn(
                    f"Could not load the {self.kind} plugin {entry_point.name!r} "
                    f"({entry_point.value}) from the entry-point group {self.entry_point_group!r}: "
                    f"{type(error).__name__}: {error}",
                    RuntimeWarning,
                    stacklevel=3,
                )


def _call_registration_hook(loaded: Any, registry: Registry[Any]) -> None:
    """An entry point names a class with a ``register_*`` classmethod, or a callable(registry)."""
    hook: Callable[[Registry[Any]], Any] | None = None
    if isinstance(loaded, type):
        hook = next(
            (
                getattr(loaded, attr)
                for attr in (
                    "register_accelerators",
                    "register_strategies",
                    "register_plugins",
                    "register_loggers",
                )
                if hasattr(loaded, attr)
            ),
            None,
        )
        if hook is None:
            raise TypeError(f"{loaded.__qualname__} has no register_accelerators/register_strategies hook")
    elif callable(loaded):
        hook = loaded
    else:
        raise TypeError(f"entry point object {loaded!r} is neither a class nor a callable")
    hook(registry)
