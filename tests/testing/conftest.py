"""The kit's tests: the stand-in ``xpulib`` is importable here and in every program the kit starts."""

from __future__ import annotations

import sys
from pathlib import Path

STAND_IN_LIBS = str(Path(__file__).parent / "stand_in_libs")
if STAND_IN_LIBS not in sys.path:
    sys.path.insert(0, STAND_IN_LIBS)  # the kit passes sys.path on to the programs' processes
