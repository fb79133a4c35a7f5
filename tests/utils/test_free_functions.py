"""Accelerate's free functions (``drivetrain.utils.gather`` …) act on the latest live Accelerator, without importing it."""

from __future__ import annotations

import gc
import subprocess
import sys

import pytest
import torch

import drivetrain as dt
from drivetrain import utils


def test_importing_the_utils_namespace_does_not_import_the_facade() -> None:
    code = (
        "import sys, drivetrain.utils; "
        "print(sorted(m for m in sys.modules if m.startswith(('drivetrain.facade', 'drivetrain.trainer'))))"
    )
    output = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert output.strip() == "[]"


def test_free_functions_use_the_latest_live_accelerator_and_say_when_there_is_none() -> None:
    gc.collect()
    with pytest.raises(
        RuntimeError, match=r"drivetrain.utils.gather needs .* no drivetrain.Accelerator exists"
    ):
        utils.gather(torch.ones(2))

    first = dt.Accelerator(cpu=True)
    second = dt.Accelerator(cpu=True, mixed_precision="bf16")
    assert torch.equal(utils.gather(torch.arange(3)), torch.arange(3))
    assert utils.reduce({"a": torch.tensor([2.0])}, reduction="sum", scale=3.0)["a"].item() == 6.0
    assert utils.gather_object(["x"]) == ["x"]
    assert utils.broadcast_object_list([1, 2]) == [1, 2]
    utils.wait_for_everyone()
    assert utils.set_seed(7, device_specific=True) == 7  # rank 0 of one process

    del second
    gc.collect()
    assert utils.gather(torch.ones(1)).tolist() == [1.0]  # the first one is still alive and takes over
    del first
    gc.collect()
    with pytest.raises(RuntimeError, match=r"no drivetrain\.Accelerator exists"):
        utils.wait_for_everyone()
