"""The fields and defaults of Accelerate's configuration dataclasses and kwargs handlers, as JSON.

    python dataclass_fields.py SITE/accelerate NAME...

runs the pinned ``accelerate`` (from its folder, in a process of its own) and prints, for each
class name, its dataclass fields and their defaults; ``test_accelerate_utilities.py`` compares
them with drivetrain's classes of the same names.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import sys
from pathlib import Path
from typing import Any


def fields(cls: type) -> dict[str, Any]:
    """Field name -> its default (``"<required>"``, or the repr of what is no plain value)."""
    found: dict[str, Any] = {}
    for field in dataclasses.fields(cls):  # type: ignore[arg-type]
        if field.default is not dataclasses.MISSING:
            value: Any = field.default
        elif field.default_factory is not dataclasses.MISSING:
            value = field.default_factory()
        else:
            value = "<required>"
        if isinstance(value, enum.Enum):
            value = f"{type(value).__name__}.{value.name}"
        found[field.name] = value if isinstance(value, (int, float, str, bool, type(None))) else repr(value)
    return found


if __name__ == "__main__":
    sys.path.append(str(Path(sys.argv[1]).parent))
    import accelerate
    import accelerate.utils

    print(
        json.dumps(
            {
                name: fields(getattr(accelerate.utils, name, None) or getattr(accelerate, name))
                for name in sys.argv[2:]
            }
        )
    )
