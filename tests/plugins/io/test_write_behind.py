"""Write-back started while a checkpoint file is written: same bytes, earlier on disk, fsync still last."""

from __future__ import annotations

import io
import os
import sys
from pathlib import Path

import pytest
import torch

from drivetrain.plugins.io import TorchCheckpointIO, write_behind
from drivetrain.plugins.io.atomic import write_file

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="sync_file_range is Linux's")


def _big_state() -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    # 3 x 4 MiB: more than two chunks of write-back.
    return {f"t{i}": torch.randn(2**20, generator=generator) for i in range(3)}


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """The write-back requests the save makes: (bytes written so far, flags); the real call still runs."""
    real = write_behind._sync_file_range()
    if real is None:
        pytest.skip("this libc has no sync_file_range")
    requests: list[tuple[int, int]] = []

    def spy(fd: int, offset: int, length: int, flags: int) -> int:
        requests.append((os.fstat(fd).st_size, flags))
        return real(fd, offset, length, flags)

    monkeypatch.setattr(write_behind, "_sync_file_range", lambda: spy)
    monkeypatch.setattr(write_behind, "CHUNK", 4 * 2**20)
    return requests


@linux_only
def test_a_checkpoint_file_starts_going_to_disk_while_it_is_written(tmp_path: Path, started) -> None:
    state = _big_state()
    TorchCheckpointIO().save_checkpoint(state, tmp_path / "c.ckpt")
    expected = io.BytesIO()
    torch.save(state, expected)
    assert (tmp_path / "c.ckpt").read_bytes() == expected.getvalue()  # the same file torch.save writes
    size = len(expected.getvalue())
    # Requested during the write, every chunk, before the file was complete; never waiting.
    assert len(started) >= 2
    assert all(written < size and flags == 2 for written, flags in started), (started, size)
    loaded = TorchCheckpointIO().load_checkpoint(tmp_path / "c.ckpt")
    assert all(torch.equal(loaded[k], v) for k, v in state.items())


@linux_only
def test_a_failed_write_still_leaves_the_previous_checkpoint(tmp_path: Path, started) -> None:
    target = tmp_path / "c.ckpt"
    TorchCheckpointIO().save_checkpoint({"step": 1}, target)

    def write_then_fail(file) -> None:
        torch.save(_big_state(), file)
        raise OSError("No space left on device")

    with pytest.raises(OSError, match="No space left"):
        write_file(target, write_then_fail)
    assert started  # write-back had begun on the temporary file
    assert TorchCheckpointIO().load_checkpoint(target) == {"step": 1}
    assert os.listdir(tmp_path) == ["c.ckpt"]


def test_without_sync_file_range_the_file_is_written_as_it_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(write_behind, "_sync_file_range", lambda: None)
    with open(tmp_path / "f", "wb") as file:
        assert write_behind.write_behind(file) is file
    state = _big_state()
    TorchCheckpointIO().save_checkpoint(state, tmp_path / "c.ckpt")
    loaded = TorchCheckpointIO().load_checkpoint(tmp_path / "c.ckpt")
    assert all(torch.equal(loaded[k], v) for k, v in state.items())
