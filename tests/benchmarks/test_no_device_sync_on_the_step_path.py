"""Neither front door makes the host wait for the GPU between optimizer steps.

On a GPU the host queues kernels ahead of the device; a ``.item()``, ``float(tensor)``, a tensor
formatted into a string, ``bool(tensor)`` or ``torch.cuda.synchronize()`` makes it wait until the
device has caught up, and in the launch-bound regime (a small model, batch 1) every such wait
shows in the step time. These are stand-ins here: the calls are counted, on the CPU, wherever
drivetrain's own code makes them (directly, or through a tensor's ``__format__``/``__float__``)
during the steps after the first two. The raw loop is the reference, so torch's own calls (the
optimizer reading its CPU step counter) do not count. On a GPU the ``cuda`` test at the end uses
torch's sync debug mode instead, and compares the doors' waits per step with the raw loop's.
"""

from __future__ import annotations

import collections
import sys
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.optim.optimizer import register_optimizer_step_post_hook
from torch.utils.data import DataLoader, TensorDataset

import drivetrain as dt

DRIVETRAIN = str(Path(dt.__file__).resolve().parent)
TORCH_TENSOR = str(Path(torch.__file__).resolve().parent / "_tensor.py")
#: Tensor methods that wait for the device when the tensor is on one.
WAITING_METHODS = (
    "item",
    "tolist",
    "numpy",
    "cpu",
    "__bool__",
    "__float__",
    "__int__",
    "__index__",
    "__format__",
    "__repr__",
    "__array__",
)
STEPS = 12
COUNTED_FROM_STEP = 2


class WaitCounter:
    """Counts device-waiting calls made by drivetrain's code while :attr:`active`."""

    def __init__(self) -> None:
        self.active = False
        self.calls: collections.Counter[tuple[str, str, int]] = collections.Counter()

    def wrap(self, owner: Any, name: str, monkeypatch: pytest.MonkeyPatch) -> None:
        original = getattr(owner, name)
        counter = self

        def counted(*args: Any, **kwargs: Any) -> Any:
            if counter.active:
                frame = sys._getframe(1)
                # A dunder's Python body in torch/_tensor.py (format -> item) is the caller's call.
                while frame is not None and frame.f_code.co_filename == TORCH_TENSOR:
                    frame = frame.f_back
                if frame is not None and frame.f_code.co_filename.startswith(DRIVETRAIN):
                    where = frame.f_code.co_filename[len(DRIVETRAIN) + 1 :]
                    counter.calls[(name, where, frame.f_lineno)] += 1
            return original(*args, **kwargs)

        monkeypatch.setattr(owner, name, counted)


@pytest.fixture
def waits(monkeypatch: pytest.MonkeyPatch) -> Iterator[WaitCounter]:
    counter = WaitCounter()
    for name in WAITING_METHODS:
        counter.wrap(torch.Tensor, name, monkeypatch)
    counter.wrap(torch.cuda, "synchronize", monkeypatch)
    steps = [0]

    def on_step(*args: Any) -> None:
        steps[0] += 1
        counter.active = COUNTED_FROM_STEP <= steps[0] < STEPS

    handle = register_optimizer_step_post_hook(on_step)
    try:
        yield counter
    finally:
        handle.remove()


def _loader() -> DataLoader:
    generator = torch.Generator().manual_seed(0)
    data = TensorDataset(
        torch.randn(8 * STEPS, 16, generator=generator), torch.randn(8 * STEPS, 1, generator=generator)
    )
    return DataLoader(data, batch_size=8)


class _Module(dt.TrainingModule):
    def __init__(self, log: bool) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
        self.log_loss = log

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        inputs, targets = batch
        loss = nn.functional.mse_loss(self.net(inputs), targets)
        if self.log_loss:
            self.log("loss", loss, prog_bar=True)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


def _trainer_fit(accelerator: str, log: bool, progress_bar: bool) -> None:
    trainer = dt.Trainer(
        accelerator=accelerator,
        devices=1,
        max_steps=STEPS,
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        enable_progress_bar=progress_bar,
    )
    trainer.fit(_Module(log), _loader())


def _accelerator_loop(accelerator: str) -> None:
    door = dt.Accelerator(cpu=accelerator == "cpu", mixed_precision="bf16")
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, optimizer, loader = door.prepare(model, optimizer, _loader())
    for inputs, targets in loader:
        loss = nn.functional.mse_loss(model(inputs), targets)
        door.backward(loss)
        optimizer.step()
        optimizer.zero_grad()


DOORS: dict[str, Callable[[str], None]] = {
    "Trainer": lambda device: _trainer_fit(device, log=False, progress_bar=False),
    "Trainer, self.log(prog_bar=True) and the progress bar": lambda device: _trainer_fit(
        device, log=True, progress_bar=True
    ),
    "Accelerator, bf16": _accelerator_loop,
}


@pytest.mark.parametrize("door", list(DOORS))
def test_no_door_waits_for_the_device_between_steps(waits: WaitCounter, door: str) -> None:
    with warnings.catch_warnings():
        # bf16 autocast on a CPU without bf16 support warns; not what this test is about.
        warnings.simplefilter("ignore", UserWarning)
        DOORS[door]("cpu")
    assert dict(waits.calls) == {}, (
        f"{door}: drivetrain waits for the device on the step path: {dict(waits.calls)}"
    )


def test_the_counter_sees_a_wait_in_drivetrains_code(
    waits: WaitCounter, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The stand-in can fail: an optimizer step of drivetrain's that formats a tensor (as a progress
    # display would) is counted once per step. The function is compiled under step_policy's file
    # name, so that its calls are drivetrain's as far as the counter can tell.
    from drivetrain.strategies import step_policy

    source = (
        "def plain_optimizer_step(optimizer, closure=None, model=None, **kwargs):\n"
        "    result = plain(optimizer, closure, model, **kwargs)\n"
        "    f\"{optimizer.param_groups[0]['params'][0].sum():.3f}\"\n"
        "    return result\n"
    )
    namespace: dict[str, Any] = {"plain": step_policy.plain_optimizer_step}
    exec(compile(source, step_policy.__file__, "exec"), namespace)
    from drivetrain.strategies import strategy

    # Strategy.step_functions hands out the plain step it imported from step_policy.
    monkeypatch.setattr(strategy, "plain_optimizer_step", namespace["plain_optimizer_step"])
    _trainer_fit("cpu", log=False, progress_bar=False)  # 32-true: the plain optimizer step
    assert list(waits.calls.values()) == [STEPS - COUNTED_FROM_STEP], dict(waits.calls)


# -- on a GPU: torch's sync debug mode -------------------------------------------------------------
def _raw_loop(accelerator: str) -> None:
    device = torch.device("cuda")
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1)).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for inputs, targets in _loader():
        inputs, targets = inputs.to(device, non_blocking=True), targets.to(device, non_blocking=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = nn.functional.mse_loss(model(inputs), targets)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()


@contextmanager
def _device_waits_between_steps() -> Iterator[list[int]]:
    """Counts the warnings of torch's sync debug mode between the same steps as the CPU test."""
    counted = [0]
    steps = [0]

    def on_step(*args: Any) -> None:
        steps[0] += 1

    def show(message: Any, *args: Any, **kwargs: Any) -> None:
        if "synchroniz" in str(message) and COUNTED_FROM_STEP <= steps[0] < STEPS:
            counted[0] += 1

    handle = register_optimizer_step_post_hook(on_step)
    previous = torch.cuda.get_sync_debug_mode()
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = show
        torch.cuda.set_sync_debug_mode("warn")
        try:
            yield counted
        finally:
            torch.cuda.set_sync_debug_mode(previous)
            handle.remove()


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("door", list(DOORS))
def test_on_a_gpu_no_door_waits_more_than_the_raw_loop(door: str) -> None:
    DOORS[door]("cuda")  # warm-up: first-use work (allocations, handles) is not the step path
    _raw_loop("cuda")
    with _device_waits_between_steps() as raw:
        _raw_loop("cuda")
    with _device_waits_between_steps() as ours:
        DOORS[door]("cuda")
    assert ours[0] <= raw[0], f"{door}: {ours[0]} device waits in {STEPS} steps, raw PyTorch {raw[0]}"
