"""Reversible changes to modules and objects, for stand-ins of hardware this machine lacks.

Like pytest's ``monkeypatch`` (which the kit must not need: it runs from a command and inside
program processes too), but only the two operations the stand-ins use.
"""

from __future__ import annotations

import sys
from collections.abc import MutableMapping
from typing import Any

_MISSING = object()


class Patches:
    """Attribute and mapping changes that :meth:`undo` reverts, newest first."""

    def __init__(self) -> None:
        self._undo: list[tuple[str, Any, Any, Any]] = []

    def setattr(self, target: Any, name: str, value: Any) -> None:
        """Set ``target.name`` to ``value``, remembering what was there (or that nothing was)."""
        self._undo.append(("attr", target, name, getattr(target, name, _MISSING)))
        setattr(target, name, value)

    def setitem(self, mapping: MutableMapping[str, Any], key: str, value: Any) -> None:
        """Set ``mapping[key]`` to ``value``, remembering what was there (or that nothing was)."""
        self._undo.append(("item", mapping, key, mapping.get(key, _MISSING)))
        mapping[key] = value

    def module(self, name: str, module: Any) -> None:
        """Put ``module`` in ``sys.modules`` under ``name`` (and on its parent package, if that is there)."""
        self.setitem(sys.modules, name, module)
        parent, _, child = name.rpartition(".")
        if parent and parent in sys.modules:
            self.setattr(sys.modules[parent], child, module)

    def undo(self) -> None:
        """Put everything back as it was before the first change."""
        while self._undo:
            kind, target, key, old = self._undo.pop()
            if kind == "attr":
                if old is _MISSING:
                    try:
                        delattr(target, key)
                    except AttributeError:
                        pass
                else:
                    setattr(target, key, old)
            elif old is _MISSING:
                target.pop(key, None)
            else:
                target[key] = old
