"""A script that registers its own accelerator by short name and reports what drivetrain resolved.

Run as ``drivetrain launch --accelerator fakexpu -n 2 this.py`` (the launcher passes the name on).
``FAIL_RANK=N`` makes rank N exit with code 3 after the all-reduce; ``FAIL_FIRST_ATTEMPT=N`` only
in the launcher's first attempt (``TORCHELASTIC_RESTART_COUNT`` 0), so a restart can succeed.
"""

import os
from typing import Any

import torch

import drivetrain as dt
from drivetrain.accelerators import Accelerator


class FakeXPUAccelerator(Accelerator):
    @staticmethod
    def parse_devices(devices: Any) -> Any:
        return devices

    @staticmethod
    def get_parallel_devices(devices: Any) -> Any:
        return [torch.device("cpu") for _ in devices]

    @staticmethod
    def auto_device_count() -> int:
        return 2

    @staticmethod
    def is_available() -> bool:
        return True

    @classmethod
    def register_accelerators(cls, accelerator_registry: Any) -> None:
        accelerator_registry.register("fakexpu", cls, description="an XPU stand-in that computes on the CPU")


strategy = dt.connect()  # everything "auto": the launcher decides
strategy.setup_environment()
total = strategy.all_reduce(torch.tensor([1.0]), reduce_op="sum").item()
line = (
    f"rank={strategy.global_rank} accelerator={type(strategy.accelerator).__name__} "
    f"strategy={type(strategy).__name__} world={strategy.world_size} sum={total} "
    f"env={type(strategy.cluster_environment).__name__} attempt={os.environ.get('TORCHELASTIC_RESTART_COUNT')}\n"
)
os.write(1, line.encode())
if os.environ.get("FAIL_RANK") == str(strategy.global_rank):
    raise SystemExit(3)
first_attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT") == "0"
if first_attempt and os.environ.get("FAIL_FIRST_ATTEMPT") == str(strategy.global_rank):
    raise SystemExit(3)
strategy.barrier()
strategy.teardown()
