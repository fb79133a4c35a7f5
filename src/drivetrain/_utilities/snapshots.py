"""Objects that can be put back as they were: snapshots one level deep."""

from __future__ import annotations

from typing import Any


def one_level(value: Any) -> Any:
    """A copy of a container (so changes to the original do not reach it); anything else as it is."""
    if isinstance(value, (list, dict, set)):
        return type(value)(value)
    return value


class Restorable:
    """Something changed in place that must be restorable: :meth:`snapshot` copies its attributes one level
    deep (containers copied, objects shared) and :meth:`restore` puts all of them back, also attributes
    added after the class was written."""

    def snapshot(self) -> dict[str, Any]:
        return {name: one_level(value) for name, value in vars(self).items()}

    def restore(self, snapshot: dict[str, Any]) -> None:
        attributes = vars(self)
        attributes.clear()
        attributes.update({name: one_level(value) for name, value in snapshot.items()})
