"""Crash-safe publishing: what every state between two renames looks like to readers and to the next save."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from drivetrain.plugins.io import TorchCheckpointIO
from drivetrain.plugins.io.atomic import (
    in_flight,
    is_complete,
    local_path,
    partial_path,
    publish_folder,
    publish_link,
    remove,
    resolve,
    tidy,
)


def _folder(path: Path, value: float) -> Path:
    path.mkdir(parents=True)
    TorchCheckpointIO().save_checkpoint({"value": value}, path / "drivetrain_state.pt")
    return path


def _value(folder: Path) -> float:
    return TorchCheckpointIO().load_checkpoint(folder / "drivetrain_state.pt")["value"]


def test_publishing_a_folder_replaces_the_old_one_and_leaves_nothing_behind(tmp_path: Path) -> None:
    target = _folder(tmp_path / "last.ckpt", 1.0)
    staging = _folder(partial_path(target, "0123456789ab"), 2.0)
    publish_folder(staging, target, "0123456789ab")
    assert _value(target) == 2.0
    assert sorted(os.listdir(tmp_path)) == ["last.ckpt"]


@pytest.mark.parametrize("moment", ["before_any_rename", "between_the_renames", "before_the_old_is_deleted"])
def test_an_interrupted_folder_publish_is_resolved_and_then_tidied(tmp_path: Path, moment: str) -> None:
    target = _folder(tmp_path / "last.ckpt", 1.0)
    token = "0123456789ab"
    staging = _folder(partial_path(target, token), 2.0)
    old = tmp_path / f".last.ckpt.drivetrain-old-{token}"
    if moment != "before_any_rename":
        os.rename(target, old)
    if moment == "before_the_old_is_deleted":
        os.rename(staging, target)
    expected = 1.0 if moment == "before_any_rename" else 2.0
    # Readers (every rank) find the checkpoint without changing anything on disk …
    found = resolve(target)
    assert found is not None and is_complete(found) and _value(found) == expected
    # … and the next save into the folder finishes the job.
    tidy(tmp_path)
    assert sorted(os.listdir(tmp_path)) == ["last.ckpt"]
    assert _value(target) == expected


def test_a_link_replaces_a_file_or_a_folder_checkpoint_in_one_rename(tmp_path: Path) -> None:
    TorchCheckpointIO().save_checkpoint({"value": 1.0}, tmp_path / "a.ckpt")
    _folder(tmp_path / "b.ckpt", 2.0)
    last = tmp_path / "last.ckpt"
    TorchCheckpointIO().save_checkpoint({"value": 0.0}, last)  # a complete last.ckpt first
    assert publish_link(tmp_path / "a.ckpt", last)
    assert os.readlink(last) == "a.ckpt" and is_complete(last)
    assert TorchCheckpointIO().load_checkpoint(last)["value"] == 1.0
    assert publish_link(tmp_path / "b.ckpt", last) and os.readlink(last) == "b.ckpt" and _value(last) == 2.0
    _folder(tmp_path / "folder_last.ckpt", 3.0)  # a folder checkpoint under the link's name is replaced too
    assert publish_link(tmp_path / "a.ckpt", tmp_path / "folder_last.ckpt")
    assert os.readlink(tmp_path / "folder_last.ckpt") == "a.ckpt"
    assert sorted(os.listdir(tmp_path)) == ["a.ckpt", "b.ckpt", "folder_last.ckpt", "last.ckpt"]
    remove(last)  # removing the link leaves its target
    assert (tmp_path / "b.ckpt").is_dir() and not last.exists()


def test_tidy_removes_leftovers_but_not_writes_in_flight(tmp_path: Path) -> None:
    (tmp_path / ".a.ckpt.drivetrain-partial-0123456789ab").write_bytes(b"half")
    (tmp_path / ".b.ckpt.drivetrain-deleted-0123456789ab").mkdir()
    (tmp_path / "user-file.txt").write_text("mine")
    (tmp_path / ".hidden-but-not-ours").write_text("mine")
    busy = tmp_path / ".c.ckpt.drivetrain-partial-ba9876543210"
    busy.write_bytes(b"being written")
    with in_flight(busy):
        tidy(tmp_path)
        assert busy.exists()
    assert sorted(os.listdir(tmp_path)) == sorted([busy.name, "user-file.txt", ".hidden-but-not-ours"])
    tidy(tmp_path)
    assert sorted(os.listdir(tmp_path)) == [".hidden-but-not-ours", "user-file.txt"]


def test_a_save_cleans_what_a_crashed_save_left(tmp_path: Path) -> None:
    (tmp_path / ".epoch=3.ckpt.drivetrain-partial-0123456789ab").write_bytes(b"truncated")
    TorchCheckpointIO().save_checkpoint({"a": 1}, tmp_path / "epoch=4.ckpt")
    assert os.listdir(tmp_path) == ["epoch=4.ckpt"]


def test_removing_a_folder_never_leaves_half_of_it_under_its_name(tmp_path: Path) -> None:
    target = _folder(tmp_path / "old.ckpt", 1.0)
    remove(target)
    assert os.listdir(tmp_path) == []
    remove(target)  # idempotent
    (tmp_path / "f.ckpt").write_bytes(b"x")
    remove(tmp_path / "f.ckpt")
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("content", [b"", b"PK\x03\x04 truncated zip", b"random bytes"])
def test_incomplete_files_and_folders_are_not_complete(tmp_path: Path, content: bytes) -> None:
    file = tmp_path / "c.ckpt"
    file.write_bytes(content)
    assert not is_complete(file)
    folder = tmp_path / "sharded.ckpt"
    folder.mkdir()
    assert not is_complete(folder)  # empty
    (folder / "drivetrain_state.pt").write_bytes(content)
    assert not is_complete(folder)
    torch.save({"a": 1}, file)
    assert is_complete(file)
    assert not is_complete(tmp_path / "missing.ckpt")


def test_remote_paths_never_become_local_folders(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="remote path"):
        local_path("s3://bucket/run/last.ckpt")  # local-only operations refuse URLs
    monkeypatch.chdir(tmp_path)
    io = TorchCheckpointIO()
    io.save_checkpoint({"a": 1}, "memory://atomic-test/run/last.ckpt")
    assert io.load_checkpoint("memory://atomic-test/run/last.ckpt") == {"a": 1}
    io.remove_checkpoint("memory://atomic-test/run/last.ckpt")
    assert resolve("memory://atomic-test/run/last.ckpt") is None
    assert os.listdir(tmp_path) == []


_SLOW_WRITER = """
import sys
from drivetrain.plugins.io.atomic import write_file

def write(file):
    file.write(b"first half ")
    file.flush()
    print("writing", flush=True)
    sys.stdin.readline()  # until the test has tidied the folder from its own process
    file.write(b"second half")

write_file(sys.argv[1], write)
print("published", flush=True)
"""


@pytest.mark.timeout(120)
def test_tidying_in_another_process_leaves_a_live_write_alone_and_still_removes_a_crashed_one(
    tmp_path: Path,
) -> None:
    import subprocess
    import sys

    crashed = tmp_path / ".old.ckpt.drivetrain-partial-0123456789ab"  # a write whose process is gone
    crashed.write_bytes(b"half")
    target = tmp_path / "live.ckpt"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[3] / "src"), *sys.path])}
    with subprocess.Popen(
        [sys.executable, "-c", _SLOW_WRITER, str(target)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    ) as writer:
        try:
            assert writer.stdout is not None and writer.stdin is not None
            assert writer.stdout.readline().strip() == "writing"
            (partial,) = [
                p for p in tmp_path.iterdir() if p.name.startswith(".live.ckpt.drivetrain-partial-")
            ]

            tidy(tmp_path)  # this process is not the writer: only the lock can tell it the write is live

            assert partial.exists(), "tidy deleted a temporary file that a live process is writing"
            assert not crashed.exists(), "tidy kept what a crashed write left"
            writer.stdin.write("go\n")
            writer.stdin.flush()
            assert writer.stdout.readline().strip() == "published"
            assert writer.wait(timeout=60) == 0
        finally:
            if writer.poll() is None:
                writer.kill()
    assert target.read_bytes() == b"first half second half"
    assert [p.name for p in tmp_path.iterdir()] == ["live.ckpt"]
