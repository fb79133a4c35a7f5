"""AsyncCheckpointIO with device tensors: pinned buffers filled on a side stream, in the right order.

No GPU here: the ordering is tested through the device-ops seam with a fake "device" whose side
stream defers its copies until something waits for them, the way a GPU runs queued work later.
The CPU tensors of these tests play the device tensors. The ``cuda`` tests at the end run the
real thing on a GPU (the GPU check runs them).
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import textwrap
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import drivetrain as dt
from drivetrain.plugins.io import AsyncCheckpointIO, CheckpointIO, device_staging
from drivetrain.trainer import Callback, ModelCheckpoint
from trainer.trainer_models import (
    Regression,
    assert_same_weights,
    loader,
    quiet_trainer,
    regression_data,
    weights,
)


class _Stream:
    def __init__(self, name: str) -> None:
        self.name = name
        self.queued: list[Any] = []  # copies not run yet
        self.done = 0  # how many of the stream's operations have run


class _Event:
    def __init__(self, stream: _Stream, position: int) -> None:
        self.stream, self.position = stream, position


class FakeDeviceOps:
    """A device whose side stream runs its copies only when something waits for them.

    The training ("main") stream is the host itself: it runs at once. So a wait of the main stream
    for a side-stream event runs the copies before it (later main work must come after them),
    unless ``main_waits=False``, which models the device's compute stream waiting without the host
    seeing anything (then only :meth:`synchronize` runs them). Pinned buffers start as NaN, so a
    file written before its copies ran shows it. :attr:`host_gate` holds the writer's wait.
    """

    device_type = "cpu"

    def __init__(self, main_waits: bool = True) -> None:
        self.main, self.side = _Stream("main"), _Stream("side")
        self.current = self.main
        self.main_waits = main_waits
        self.log: list[tuple[str, ...]] = []
        self.pinned: list[torch.Tensor] = []
        self.host_gate = threading.Event()
        self.host_gate.set()
        self._lock = threading.RLock()

    def current_stream(self, device: torch.device) -> _Stream:
        return self.current

    def side_stream(self, device: torch.device) -> _Stream:
        return self.side

    def record_event(self, stream: _Stream) -> _Event:
        with self._lock:
            self.log.append(("record", stream.name))
            return _Event(stream, stream.done + len(stream.queued))

    def wait_event(self, stream: _Stream, event: _Event) -> None:
        self.log.append(("wait", stream.name, event.stream.name))
        if stream is self.main and self.main_waits:
            self._run(event)

    @contextmanager
    def use_stream(self, stream: _Stream) -> Any:
        previous, self.current = self.current, stream
        try:
            yield
        finally:
            self.current = previous

    def copy(self, destination: torch.Tensor, source: torch.Tensor) -> None:
        self.log.append(("copy", self.current.name))
        if self.current is self.main:
            destination.copy_(source)
        else:
            with self._lock:
                self.current.queued.append(lambda: destination.copy_(source))

    def pinned_empty(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        buffer = torch.empty(shape, dtype=dtype)
        if dtype.is_floating_point:
            buffer.fill_(math.nan)
        elif dtype != torch.bool:
            buffer.fill_(torch.iinfo(dtype).max)
        self.pinned.append(buffer)
        return buffer

    def synchronize(self, event: _Event) -> None:
        assert self.host_gate.wait(10), "the test never opened the host gate"
        self._run(event)

    def _run(self, event: _Event) -> None:
        with self._lock:
            stream = event.stream
            while stream.done < event.position:
                stream.queued.pop(0)()
                stream.done += 1


@pytest.fixture
def fake_device(monkeypatch: pytest.MonkeyPatch) -> Any:
    """Register a :class:`FakeDeviceOps` factory for CPU tensors; yields a function making the fake."""
    made: list[FakeDeviceOps] = []
    settings: dict[str, Any] = {}

    def factory() -> FakeDeviceOps:
        made.append(FakeDeviceOps(**settings))
        return made[-1]

    monkeypatch.setitem(device_staging.DEVICE_OPS, "cpu", factory)

    def configure(**options: Any) -> list[FakeDeviceOps]:
        settings.update(options)
        return made

    return configure


def _state() -> dict[str, Any]:
    torch.manual_seed(0)
    return {"model": nn.Linear(8, 4).state_dict(), "extra": torch.arange(6.0), "epoch": 3}


def test_the_save_returns_with_the_copies_queued_and_the_next_step_cannot_overwrite_them(
    tmp_path: Path, fake_device: Any
) -> None:
    made = fake_device()
    io = AsyncCheckpointIO()
    state = _state()
    expected = {k: v.clone() for k, v in state["model"].items()}
    io.save_checkpoint(state, tmp_path / "a.ckpt")
    ops = made[0]
    ops.host_gate.clear()  # the writer cannot look at the buffers yet
    # The device order: the side stream waits for the step's work, copies, and the training
    # stream waits for the copies before anything queued after the save.
    assert ops.log == [
        ("record", "main"),
        ("wait", "side", "main"),
        ("copy", "side"),
        ("copy", "side"),
        ("copy", "side"),
        ("record", "side"),
        ("wait", "main", "side"),
    ]
    with torch.no_grad():  # the next step's update, queued after the save on the training stream
        for tensor in state["model"].values():
            tensor.add_(1.0)
    ops.host_gate.set()
    saved = io.load_checkpoint(tmp_path / "a.ckpt")
    io.teardown()
    assert_same_weights(saved["model"], expected)
    assert torch.equal(saved["extra"], torch.arange(6.0)) and saved["epoch"] == 3


def test_the_writer_waits_for_the_copies_before_it_serialises(tmp_path: Path, fake_device: Any) -> None:
    # The compute stream's wait is invisible to the host: only the writer's own wait runs the copies.
    fake_device(main_waits=False)
    io = AsyncCheckpointIO()
    state = _state()
    io.save_checkpoint(state, tmp_path / "a.ckpt")
    io.teardown()
    saved = torch.load(tmp_path / "a.ckpt", weights_only=True)
    assert_same_weights(saved["model"], state["model"])


def test_pinned_buffers_are_reused_from_save_to_save(tmp_path: Path, fake_device: Any) -> None:
    made = fake_device()
    io = AsyncCheckpointIO()
    state = _state()
    io.save_checkpoint(state, tmp_path / "a.ckpt")
    io.load_checkpoint(tmp_path / "a.ckpt")  # waits until the save is written
    allocated = list(made[0].pinned)
    with torch.no_grad():
        state["model"]["weight"].mul_(2)
    io.save_checkpoint(state, tmp_path / "b.ckpt")
    saved = io.load_checkpoint(tmp_path / "b.ckpt")
    io.teardown()
    assert len(allocated) == 3 and made[0].pinned == allocated  # nothing new was pinned
    assert torch.equal(saved["model"]["weight"], state["model"]["weight"])


def test_a_checkpoint_of_plain_cpu_tensors_keeps_todays_copy() -> None:
    pool = device_staging.DeviceStagingPool()
    assert not pool.holds_device_tensors(_state())  # no device ops for the CPU: staging.py copies


class _Record(Callback):
    def __init__(self, recorded: dict[int, dict[str, torch.Tensor]]) -> None:
        self.recorded = recorded

    def on_train_batch_end(self, trainer: dt.Trainer, module: Any, *args: Any) -> None:
        self.recorded[trainer.global_step] = {k: v.cpu() for k, v in weights(module).items()}


def _fit_saving_every_step(tmp_path: Path, **trainer_options: Any) -> tuple[dict[int, Any], Path]:
    recorded: dict[int, dict[str, torch.Tensor]] = {}
    torch.manual_seed(1)
    model = Regression(optimizer="adam", lr=0.02)
    folder = tmp_path / "ckpt"
    checkpoint = ModelCheckpoint(
        dirpath=folder, every_n_train_steps=1, save_top_k=-1, save_last=True, filename="{step}"
    )
    trainer = quiet_trainer(
        max_epochs=2,
        callbacks=[_Record(recorded), checkpoint],
        enable_checkpointing=True,
        plugins=[AsyncCheckpointIO()],
        **trainer_options,
    )
    trainer.fit(model, loader(regression_data(48), batch_size=8, shuffle=True))
    return recorded, folder


def test_a_fit_saving_every_step_through_the_device_path_holds_each_steps_state(
    tmp_path: Path, fake_device: Any
) -> None:
    made = fake_device()
    recorded, folder = _fit_saving_every_step(tmp_path)
    assert sorted(recorded) == list(range(1, 13)) and made and made[0].pinned
    for step, expected in recorded.items():
        saved = torch.load(folder / f"step={step}.ckpt", weights_only=False)
        assert saved["global_step"] == step
        assert_same_weights(saved["state_dict"], expected)


_CRASHING_FIT = textwrap.dedent(
    """
    import os, sys
    import torch
    sys.path.insert(0, {tests!r})
    import drivetrain as dt
    from drivetrain.plugins.io import AsyncCheckpointIO, TorchCheckpointIO
    from drivetrain.plugins.io import torch_io
    from drivetrain.trainer import Callback, ModelCheckpoint
    from trainer.trainer_models import Regression, loader, quiet_trainer, regression_data

    folder = {folder!r}

    class CrashOnSave(TorchCheckpointIO):
        # The 5th write dies half-way: the process is gone before the file is complete.
        def __init__(self):
            self.saves = 0

        def save_checkpoint(self, checkpoint, path, storage_options=None):
            self.saves += 1
            if self.saves == 5:
                def half_then_die(obj, file):
                    file.write(b"\\x80" * 4096)
                    file.flush()
                    os._exit(17)
                torch_io.torch.save = half_then_die
            super().save_checkpoint(checkpoint, path, storage_options)

    class Record(Callback):
        def on_train_batch_end(self, trainer, module, *args):
            state = {{k: v.detach().cpu().clone() for k, v in module.state_dict().items()}}
            with open(os.path.join(folder, "expected-%d.pt" % trainer.global_step), "wb") as file:
                torch.save(state, file)

    torch.manual_seed(1)
    trainer = quiet_trainer(
        accelerator={accelerator!r},
        max_epochs=2,
        callbacks=[Record(), ModelCheckpoint(dirpath=folder, every_n_train_steps=1, save_top_k=0, save_last=True)],
        enable_checkpointing=True,
        plugins=[AsyncCheckpointIO(CrashOnSave())],
    )
    trainer.fit(Regression(optimizer="adam", lr=0.02), loader(regression_data(48), batch_size=8))
    """
)


def _crash_mid_write_leaves_the_previous_checkpoint(tmp_path: Path, accelerator: str) -> None:
    folder = tmp_path / "run"
    folder.mkdir()
    tests = str(Path(__file__).resolve().parents[2])
    script = _CRASHING_FIT.format(tests=tests, folder=str(folder), accelerator=accelerator)
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env={**os.environ}
    )
    assert done.returncode == 17, done.stderr[-2000:]
    # The 4th save (step 4) was complete before the 5th started: last.ckpt is step 4's, whole.
    last = torch.load(folder / "last.ckpt", weights_only=False, map_location="cpu")
    assert last["global_step"] == 4
    assert_same_weights(last["state_dict"], torch.load(folder / "expected-4.pt", weights_only=True))


def test_a_crash_in_the_middle_of_a_background_write_leaves_the_previous_checkpoint(tmp_path: Path) -> None:
    _crash_mid_write_leaves_the_previous_checkpoint(tmp_path, "cpu")


# -- on a GPU --------------------------------------------------------------------------------------
_needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.mark.cuda
@_needs_cuda
def test_cuda_snapshots_go_through_pinned_buffers_on_a_side_stream(tmp_path: Path) -> None:
    io = AsyncCheckpointIO()
    model = nn.Linear(256, 256).cuda()
    expected = {k: v.cpu() for k, v in model.state_dict().items()}
    io.save_checkpoint({"model": model.state_dict()}, tmp_path / "a.ckpt")
    with torch.no_grad():  # queued on the training stream after the save: must not reach the file
        model.weight.mul_(0)
    saved = io.load_checkpoint(tmp_path / "a.ckpt")
    pool = io._device_staging
    assert pool is not None and pool._idle, "the save did not go through the pinned path"
    assert all(b.is_pinned() for buffers in pool._idle[0].buffers.values() for b in buffers)
    io.teardown()
    assert_same_weights(saved["model"], expected)


@pytest.mark.cuda
@_needs_cuda
def test_a_cuda_fit_saving_every_step_holds_each_steps_state_bitwise(tmp_path: Path) -> None:
    recorded, folder = _fit_saving_every_step(tmp_path, accelerator="cuda")
    assert sorted(recorded) == list(range(1, 13))
    for step, expected in recorded.items():
        saved = torch.load(folder / f"step={step}.ckpt", weights_only=False, map_location="cpu")
        assert saved["global_step"] == step
        assert_same_weights(saved["state_dict"], expected)


@pytest.mark.cuda
@_needs_cuda
def test_a_crash_in_the_middle_of_a_background_cuda_write_leaves_the_previous_checkpoint(
    tmp_path: Path,
) -> None:
    _crash_mid_write_leaves_the_previous_checkpoint(tmp_path, "cuda")


def test_torch_io_is_what_gets_pinned_buffers() -> None:
    assert AsyncCheckpointIO()._device_staging is not None
    assert AsyncCheckpointIO(_Keeper())._device_staging is None


class _Keeper(CheckpointIO):  # a CheckpointIO of one's own may keep what it is given
    def save_checkpoint(self, checkpoint: Any, path: Any, storage_options: Any = None) -> None:
        self.kept = checkpoint

    def load_checkpoint(self, path: Any, map_location: Any = None, **kwargs: Any) -> Any:
        return self.kept

    def remove_checkpoint(self, path: Any) -> None:
        pass
