"""AsyncCheckpointIO: snapshots, background writes in order, and errors that are never lost."""

from __future__ import annotations

import gc
import pickle
import subprocess
import sys
import textwrap
import threading
import time

import pytest
import torch
from torch import nn

from drivetrain.plugins.io import AsyncCheckpointIO, CheckpointIO, TorchCheckpointIO


class GatedIO(TorchCheckpointIO):
    """Writes only once the test opens the gate, so a save is certainly still pending."""

    def __init__(self) -> None:
        self.started = threading.Event()
        self.gate = threading.Event()

    def save_checkpoint(self, checkpoint, path, storage_options=None):
        self.started.set()
        assert self.gate.wait(10), "the test never opened the gate"
        super().save_checkpoint(checkpoint, path, storage_options)


class FailingIO(TorchCheckpointIO):
    """Fails every save to a path whose name starts with "bad"; every save waits for the gate.

    Closing the gate keeps a failure from happening before the test has queued what it needs.
    """

    def __init__(self) -> None:
        self.good_save_started = threading.Event()
        self.gate = threading.Event()
        self.gate.set()

    def save_checkpoint(self, checkpoint, path, storage_options=None):
        assert self.gate.wait(10), "the test never opened the gate"
        if str(path.name).startswith("bad"):
            raise OSError(f"No space left on device: {path.name}")
        self.good_save_started.set()
        super().save_checkpoint(checkpoint, path, storage_options)


def _open_later(event: threading.Event, delay: float = 0.2) -> threading.Timer:
    timer = threading.Timer(delay, event.set)
    timer.start()
    return timer


def test_default_is_torch_io_and_round_trip(tmp_path):
    io = AsyncCheckpointIO()
    assert isinstance(io.checkpoint_io, TorchCheckpointIO)
    io.save_checkpoint({"w": torch.arange(3.0), "epoch": 4}, tmp_path / "c.ckpt")
    loaded = io.load_checkpoint(tmp_path / "c.ckpt", map_location="cpu")
    assert torch.equal(loaded["w"], torch.arange(3.0)) and loaded["epoch"] == 4
    io.teardown()


def test_rejects_something_that_is_not_a_checkpoint_io():
    with pytest.raises(TypeError, match="expects a CheckpointIO"):
        AsyncCheckpointIO(object())


def test_mutating_the_model_after_save_does_not_change_what_is_saved(tmp_path):
    inner = GatedIO()
    io = AsyncCheckpointIO(inner)
    model = nn.Linear(4, 4)
    expected = {k: v.clone() for k, v in model.state_dict().items()}
    io.save_checkpoint({"model": model.state_dict(), "weight": model.weight}, tmp_path / "c.ckpt")
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(1.0)  # training goes on while the save is pending
    inner.gate.set()
    io.teardown()
    loaded = TorchCheckpointIO().load_checkpoint(tmp_path / "c.ckpt")
    for key, value in expected.items():
        assert torch.equal(loaded["model"][key], value)
    assert type(loaded["weight"]) is torch.Tensor and not loaded["weight"].requires_grad


def test_a_tensor_saved_twice_stays_shared(tmp_path):
    io = AsyncCheckpointIO()
    tied = torch.ones(3)
    io.save_checkpoint({"encoder": tied, "decoder": tied}, tmp_path / "c.ckpt")
    loaded = io.load_checkpoint(tmp_path / "c.ckpt")
    assert loaded["encoder"].data_ptr() == loaded["decoder"].data_ptr()
    io.teardown()


def test_storage_options_are_rejected_at_once(tmp_path):
    io = AsyncCheckpointIO()
    with pytest.raises(TypeError, match="takes storage_options for remote paths"):
        io.save_checkpoint({"a": 1}, tmp_path / "c.ckpt", storage_options={"bucket": "b"})
    io.teardown()


def test_load_waits_for_a_pending_save(tmp_path):
    inner = GatedIO()
    io = AsyncCheckpointIO(inner)
    io.save_checkpoint({"step": 7}, tmp_path / "c.ckpt")
    assert inner.started.wait(10)
    timer = _open_later(inner.gate)
    assert io.load_checkpoint(tmp_path / "c.ckpt")["step"] == 7  # the file does not exist yet
    timer.join()
    io.teardown()


def test_remove_waits_for_a_pending_save_to_the_same_path(tmp_path):
    inner = GatedIO()
    io = AsyncCheckpointIO(inner)
    io.save_checkpoint({"step": 7}, tmp_path / "c.ckpt")
    timer = _open_later(inner.gate)
    io.remove_checkpoint(tmp_path / "c.ckpt")
    timer.join()
    io.teardown()
    assert not (tmp_path / "c.ckpt").exists()


def test_two_saves_to_one_path_are_applied_in_order(tmp_path):
    class SlowFirst(TorchCheckpointIO):
        def save_checkpoint(self, checkpoint, path, storage_options=None):
            if checkpoint["version"] == 1:
                time.sleep(0.3)  # a second worker, if there were one, would finish first
            super().save_checkpoint(checkpoint, path, storage_options)

    io = AsyncCheckpointIO(SlowFirst())
    io.save_checkpoint({"version": 1}, tmp_path / "c.ckpt")
    io.save_checkpoint({"version": 2}, tmp_path / "c.ckpt")
    assert io.load_checkpoint(tmp_path / "c.ckpt")["version"] == 2
    io.teardown()


def test_a_failed_save_is_raised_by_the_next_save(tmp_path):
    inner = FailingIO()
    inner.gate.clear()
    io = AsyncCheckpointIO(inner)
    io.save_checkpoint({"a": 1}, tmp_path / "bad.ckpt")
    io.save_checkpoint({"a": 2}, tmp_path / "good.ckpt")
    inner.gate.set()
    # The worker runs saves in order: once the second has started, the first has failed.
    assert inner.good_save_started.wait(10)
    with pytest.raises(OSError, match=r"No space left on device: bad\.ckpt") as excinfo:
        io.save_checkpoint({"a": 3}, tmp_path / "next.ckpt")
    assert any("bad.ckpt" in note for note in getattr(excinfo.value, "__notes__", []))
    io.teardown()  # reported once: nothing left to raise
    assert (tmp_path / "good.ckpt").exists() and not (tmp_path / "next.ckpt").exists()


def test_a_failed_save_is_raised_by_load_and_remove(tmp_path):
    io = AsyncCheckpointIO(FailingIO())
    io.save_checkpoint({"a": 1}, tmp_path / "bad.ckpt")
    with pytest.raises(OSError, match=r"bad\.ckpt"):
        io.remove_checkpoint(tmp_path / "other.ckpt")
    io.save_checkpoint({"a": 1}, tmp_path / "bad2.ckpt")
    with pytest.raises(OSError, match=r"bad2\.ckpt"):
        io.load_checkpoint(tmp_path / "other.ckpt")
    io.teardown()


def test_teardown_raises_a_failed_save_and_mentions_later_failures(tmp_path):
    inner = FailingIO()
    inner.gate.clear()
    io = AsyncCheckpointIO(inner)
    io.save_checkpoint({"a": 1}, tmp_path / "bad1.ckpt")
    io.save_checkpoint({"a": 1}, tmp_path / "good.ckpt")
    io.save_checkpoint({"a": 1}, tmp_path / "bad2.ckpt")
    inner.gate.set()
    with pytest.raises(OSError, match=r"bad1\.ckpt") as excinfo:
        io.teardown()
    assert any("bad2.ckpt" in note for note in getattr(excinfo.value, "__notes__", []))
    assert (tmp_path / "good.ckpt").exists()
    # Usable again after teardown.
    io.save_checkpoint({"a": 5}, tmp_path / "again.ckpt")
    assert io.load_checkpoint(tmp_path / "again.ckpt")["a"] == 5
    io.teardown()


def test_an_unreported_failure_warns_when_the_io_is_dropped(tmp_path):
    io = AsyncCheckpointIO(FailingIO())
    io.save_checkpoint({"a": 1}, tmp_path / "bad.ckpt")
    with pytest.warns(RuntimeWarning, match=r"never reported.*bad\.ckpt"):
        del io
        gc.collect()


def test_an_unreported_failure_warns_at_interpreter_exit(tmp_path):
    script = textwrap.dedent(
        f"""
        from drivetrain.plugins.io import AsyncCheckpointIO, TorchCheckpointIO

        class FailingIO(TorchCheckpointIO):
            def save_checkpoint(self, checkpoint, path, storage_options=None):
                raise OSError("disk on fire")

        keep = AsyncCheckpointIO(FailingIO())
        keep.save_checkpoint({{"a": 1}}, {str(tmp_path / "x.ckpt")!r})
        """
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "never reported" in result.stderr and "disk on fire" in result.stderr


def test_pickles_for_spawned_processes(tmp_path):
    io = AsyncCheckpointIO()
    io.save_checkpoint({"a": 1}, tmp_path / "c.ckpt")
    clone = pickle.loads(pickle.dumps(io))
    assert isinstance(clone, CheckpointIO) and isinstance(clone.checkpoint_io, TorchCheckpointIO)
    clone.save_checkpoint({"a": 2}, tmp_path / "d.ckpt")
    assert clone.load_checkpoint(tmp_path / "d.ckpt")["a"] == 2
    clone.teardown()
    io.teardown()


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_snapshot_of_cuda_tensors_is_taken_before_save_returns(tmp_path):
    inner = GatedIO()
    io = AsyncCheckpointIO(inner)
    model = nn.Linear(64, 64).cuda()
    expected = {k: v.cpu() for k, v in model.state_dict().items()}
    io.save_checkpoint({"model": model.state_dict()}, tmp_path / "c.ckpt")
    with torch.no_grad():
        model.weight.mul_(0)
    inner.gate.set()
    loaded = io.load_checkpoint(tmp_path / "c.ckpt")
    io.teardown()
    for key, value in expected.items():
        assert loaded["model"][key].device.type == "cpu" and torch.equal(loaded["model"][key], value)


# -- staging memory reused from save to save ---------------------------------------------------------
class RecordingIO(TorchCheckpointIO):
    """Records where the tensors it is given live (addresses only: it keeps no tensor)."""

    def __init__(self) -> None:
        self.addresses: list[list[int]] = []

    def save_checkpoint(self, checkpoint, path, storage_options=None):
        tensors = [*checkpoint["model"].values(), checkpoint["extra"]]
        self.addresses.append([t.data_ptr() for t in tensors])
        super().save_checkpoint(checkpoint, path, storage_options)


def _state(model: nn.Module, extra: torch.Tensor) -> dict:
    return {"model": model.state_dict(), "extra": extra, "epoch": 1}


def test_reused_staging_memory_never_leaks_one_save_into_another(tmp_path):
    inner = RecordingIO()
    io = AsyncCheckpointIO(inner)
    model, extra = nn.Linear(64, 32), torch.zeros(5)
    first = {k: v.clone() for k, v in model.state_dict().items()}
    io.save_checkpoint(_state(model, extra), tmp_path / "first.ckpt")
    io.load_checkpoint(tmp_path / "first.ckpt")  # waits: the first save is written
    with torch.no_grad():
        model.weight.mul_(-2.0)
        model.bias.add_(3.0)
    extra.fill_(7.0)
    second = {k: v.clone() for k, v in model.state_dict().items()}
    io.save_checkpoint(_state(model, extra), tmp_path / "second.ckpt")
    io.teardown()
    # The second snapshot went into the first one's memory (the case where a leak could happen).
    assert inner.addresses[1] == inner.addresses[0]
    loaded_first = TorchCheckpointIO().load_checkpoint(tmp_path / "first.ckpt")
    loaded_second = TorchCheckpointIO().load_checkpoint(tmp_path / "second.ckpt")
    for key in first:
        assert torch.equal(loaded_first["model"][key], first[key])
        assert torch.equal(loaded_second["model"][key], second[key])
    assert torch.equal(loaded_first["extra"], torch.zeros(5))
    assert torch.equal(loaded_second["extra"], torch.full((5,), 7.0))


def test_a_save_taken_while_another_is_pending_gets_memory_of_its_own(tmp_path):
    class GatedRecordingIO(RecordingIO):
        def __init__(self) -> None:
            super().__init__()
            self.gate = threading.Event()

        def save_checkpoint(self, checkpoint, path, storage_options=None):
            assert self.gate.wait(10), "the test never opened the gate"
            super().save_checkpoint(checkpoint, path, storage_options)

    inner = GatedRecordingIO()
    io = AsyncCheckpointIO(inner)
    model, extra = nn.Linear(8, 8), torch.zeros(3)
    first = {k: v.clone() for k, v in model.state_dict().items()}
    io.save_checkpoint(_state(model, extra), tmp_path / "first.ckpt")  # pending until the gate opens
    with torch.no_grad():
        model.weight.add_(1.0)
    io.save_checkpoint(_state(model, extra), tmp_path / "second.ckpt")
    inner.gate.set()
    io.teardown()
    assert set(inner.addresses[0]).isdisjoint(inner.addresses[1])
    loaded_first = TorchCheckpointIO().load_checkpoint(tmp_path / "first.ckpt")
    loaded_second = TorchCheckpointIO().load_checkpoint(tmp_path / "second.ckpt")
    assert torch.equal(loaded_first["model"]["weight"], first["weight"])
    assert torch.equal(loaded_second["model"]["weight"], first["weight"] + 1.0)


def test_a_checkpoint_whose_tensors_change_shape_between_saves_is_saved_whole(tmp_path):
    io = AsyncCheckpointIO()
    io.save_checkpoint({"w": torch.ones(4), "b": torch.zeros(2, dtype=torch.int64)}, tmp_path / "a.ckpt")
    io.load_checkpoint(tmp_path / "a.ckpt")
    later = {
        "w": torch.arange(6.0).view(2, 3),
        "b": torch.ones(2, dtype=torch.int64),
        "new": torch.full((3,), 2.0),
    }
    later["view"] = torch.arange(10.0)[::2]  # not contiguous: copied as it is
    later["sparse"] = torch.eye(3).to_sparse()
    io.save_checkpoint(later, tmp_path / "b.ckpt")
    loaded = io.load_checkpoint(tmp_path / "b.ckpt")
    io.teardown()
    assert set(loaded) == set(later)
    for key, value in later.items():
        dense = value.to_dense() if value.is_sparse else value
        assert loaded[key].dtype == value.dtype and torch.equal(loaded[key].to_dense(), dense), key


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors is in prototype stage")
def test_nested_tensors_are_snapshotted_too(tmp_path):
    ragged = torch.nested.nested_tensor([torch.ones(2), torch.arange(3.0)])
    io = AsyncCheckpointIO()
    io.save_checkpoint({"ragged": ragged, "w": torch.ones(2)}, tmp_path / "c.ckpt")
    loaded = io.load_checkpoint(tmp_path / "c.ckpt", weights_only=False)
    io.teardown()
    assert [t.tolist() for t in loaded["ragged"].unbind()] == [[1.0, 1.0], [0.0, 1.0, 2.0]]


def test_a_checkpoint_io_of_ones_own_gets_new_copies_it_may_keep(tmp_path):
    class KeepingIO(CheckpointIO):
        """Keeps every checkpoint in memory, as an in-memory store would."""

        def __init__(self) -> None:
            self.kept: dict[str, dict] = {}

        def save_checkpoint(self, checkpoint, path, storage_options=None):
            self.kept[str(path)] = checkpoint

        def load_checkpoint(self, path, map_location=None):
            return self.kept[str(path)]

        def remove_checkpoint(self, path):
            self.kept.pop(str(path), None)

    io = AsyncCheckpointIO(KeepingIO())
    weights = torch.zeros(4)
    io.save_checkpoint({"w": weights}, "one")
    io.load_checkpoint("one")
    weights.fill_(1.0)
    io.save_checkpoint({"w": weights}, "two")
    assert torch.equal(io.load_checkpoint("one")["w"], torch.zeros(4))
    assert torch.equal(io.load_checkpoint("two")["w"], torch.ones(4))
    io.teardown()
