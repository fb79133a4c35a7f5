"""Settings that ``drivetrain launch`` hands to the processes it starts.

``drivetrain launch --accelerator xpu script.py`` cannot resolve ``"xpu"`` itself when the script
registers that name, so it passes the name on and :func:`drivetrain.connect` resolves it inside
the script, after the script's own registrations ran.
"""

from __future__ import annotations

import os

ACCELERATOR_VARIABLE = "DRIVETRAIN_ACCELERATOR"


def launched_accelerator() -> str | None:
    """The accelerator name ``drivetrain launch --accelerator`` asked for, if any."""
    value = os.environ.get(ACCELERATOR_VARIABLE, "").strip()
    return value or None
