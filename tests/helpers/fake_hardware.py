"""Hardware this machine lacks, faked at torch's boundary for tests: the kit's stand-ins, undone with the test.

The machinery lives in :mod:`drivetrain.testing.fake_hardware` (plugin authors use it too); here it
records its changes in the test's ``monkeypatch``. CUDA, XPU and MPS are faked by patching
``torch.cuda.device_count`` and friends, XLA and HPU by stand-in packages in ``sys.modules``:
never by patching drivetrain's own functions.
"""

from __future__ import annotations

import pytest

from drivetrain.testing.fake_hardware import FakeHardware as _KitFakeHardware


class FakeHardware(_KitFakeHardware):
    """Switches the faked hardware of one test on and off."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        super().__init__(monkeypatch)
