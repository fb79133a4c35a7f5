"""Extension hooks that got public names: the old private names keep working in subclasses, with a warning.

A base class lists its renamed hooks and calls :func:`sync_renamed_hooks` from
``__init_subclass__``. At every level of the hierarchy the old and the new name then point at the
same function, so an override under either name is the one called, and ``super()`` under either
name reaches the parent's implementation. It happens once, when the class is created: calls cost
nothing extra.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping


def sync_renamed_hooks(cls: type, renamed: Mapping[str, str]) -> None:
    """Make ``cls``'s overrides under old names (keys) and new names (values) one and the same.

    Raises:
        TypeError: ``cls`` defines a hook under both names.
    """
    for old, new in renamed.items():
        defines_old, defines_new = old in cls.__dict__, new in cls.__dict__
        if defines_old and defines_new:
            raise TypeError(
                f"{cls.__qualname__} defines both {old} and {new}; {old} is the old name of {new}. "
                f"Keep only {new}."
            )
        if defines_old:
            warnings.warn(
                f"{cls.__qualname__}.{old} overrides a hook that is now public as {new}; rename the method to "
                f"{new} (the old name still works but will be removed).",
                DeprecationWarning,
                stacklevel=3,
            )
            setattr(cls, new, cls.__dict__[old])
        elif defines_new:
            setattr(cls, old, cls.__dict__[new])
