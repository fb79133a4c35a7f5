"""Switch faked hardware on and off: the stand-ins of :mod:`drivetrain.testing.stand_ins`, by device kind.

Made for tests that need "this machine has 4 GPUs" or "torch_xla is installed" without the
hardware. With pytest, pass the test's ``monkeypatch`` so that everything is undone when the test
ends; elsewhere, use the object as a context manager (or call :meth:`FakeHardware.undo`)::

    with FakeHardware() as hardware:
        hardware.cuda(4)
        assert drivetrain.accelerators.CUDAAccelerator.auto_device_count() == 4
"""

from __future__ import annotations

from typing import Any

from drivetrain.testing.patching import Patches
from drivetrain.testing.stand_ins import (
    CUDAStandIn,
    HPUStandIn,
    MPSStandIn,
    XLAStandIn,
    XPUStandIn,
    hide_torch_xla,
)


class FakeHardware:
    """Starts with no CUDA, XPU, MPS, XLA or HPU, whatever this machine has; switch on what you need.

    Args:
        patches: where the changes are recorded: pytest's ``monkeypatch`` (undone with the test) or
            a :class:`~drivetrain.testing.patching.Patches`; a private one when omitted (undone by
            :meth:`undo` or at the end of a ``with`` block).
    """

    def __init__(self, patches: Any = None) -> None:
        self._patches = patches if patches is not None else Patches()
        self._xla: XLAStandIn | None = None
        self.cuda(0)
        self.xpu(0)
        self.mps(False)
        self.hide_torch_xla()

    def cuda(self, count: int) -> CUDAStandIn:
        """``torch.cuda`` reports ``count`` GPUs."""
        return _installed(CUDAStandIn(count, self._patches))

    def xpu(self, count: int) -> XPUStandIn:
        """``torch.xpu`` reports ``count`` Intel GPUs."""
        return _installed(XPUStandIn(count, self._patches))

    def mps(self, available: bool, machine: str = "arm64") -> MPSStandIn:
        """An Apple silicon Mac with MPS (``available``), or a machine without it."""
        return _installed(MPSStandIn(1 if available else 0, self._patches, machine=machine))

    def hide_torch_xla(self) -> None:
        """Make ``torch_xla`` and ``habana_frameworks`` look uninstalled, even where they are."""
        hide_torch_xla(self._patches)

    def torch_xla(
        self,
        *,
        device_type: str = "TPU",
        count: int = 4,
        error: type[Exception] | None = None,
        memory_info: dict[str, int] | None = None,
    ) -> XLAStandIn:
        """A stand-in ``torch_xla`` package reporting ``count`` devices of ``device_type``."""
        self._xla = _installed(
            XLAStandIn(
                count, self._patches, device_type_name=device_type, error=error, memory_info=memory_info
            )
        )
        return self._xla

    def hpu(self, count: int) -> HPUStandIn:
        """A stand-in ``habana_frameworks`` package (Intel Gaudi) reporting ``count`` cards."""
        return _installed(HPUStandIn(count, self._patches))

    @property
    def xla_waits(self) -> int:
        """How often the latest ``torch_xla`` stand-in was asked to wait for its device (``wait_device_ops``)."""
        return self._xla.calls["wait_device_ops"] if self._xla is not None else 0

    def undo(self) -> None:
        """Put the real hardware libraries back (only for a private :class:`~drivetrain.testing.patching.Patches`)."""
        if isinstance(self._patches, Patches):
            self._patches.undo()

    def __enter__(self) -> FakeHardware:
        return self

    def __exit__(self, *exc: object) -> None:
        self.undo()


def _installed(stand_in: Any) -> Any:
    stand_in.install()
    return stand_in
