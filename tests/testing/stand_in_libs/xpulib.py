"""A stand-in for the seeds' fictional ``xpulib``: two "XPU" devices, no hardware behind them.

The seed's ``XPUAccelerator`` asks it whether XPUs are there and how many; the kit runs that
accelerator with ``fake=True``, so its ``torch.device("xpu", i)`` devices compute on the CPU.
"""


def is_available() -> bool:
    return True


def available_devices() -> int:
    return 2
