"""TorchCheckpointIO: atomic saves, safe loads, idempotent removal."""

from __future__ import annotations

import os
import pickle

import pytest
import torch
from torch import nn

from drivetrain.plugins.io import CheckpointIO, TorchCheckpointIO


class Opaque:
    """A class torch's weights_only loader does not know."""

    def __init__(self, value: int) -> None:
        self.value = value


class ExplodingPickle:
    """Fails while being pickled, after torch.save has started writing the file."""

    def __init__(self, directory) -> None:
        self.directory = directory
        self.files_seen: list[str] = []

    def __reduce__(self):
        self.files_seen.extend(sorted(os.listdir(self.directory)))
        raise RuntimeError("cannot pickle this")


def _checkpoint() -> dict:
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.randn(4, 3)).sum().backward()
    optimizer.step()
    return {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": 2, "extra": [1.5, "x"]}


def test_is_a_checkpoint_io():
    assert isinstance(TorchCheckpointIO(), CheckpointIO)


def test_round_trip_creates_parent_directories(tmp_path):
    io = TorchCheckpointIO()
    checkpoint = _checkpoint()
    path = tmp_path / "deep" / "er" / "last.ckpt"
    io.save_checkpoint(checkpoint, str(path))
    loaded = io.load_checkpoint(path)
    assert loaded["epoch"] == 2 and loaded["extra"] == [1.5, "x"]
    for key, value in checkpoint["model"].items():
        assert torch.equal(loaded["model"][key], value)
    assert torch.equal(
        loaded["optimizer"]["state"][0]["exp_avg"], checkpoint["optimizer"]["state"][0]["exp_avg"]
    )
    assert os.listdir(path.parent) == ["last.ckpt"]


def test_overwrites_an_existing_checkpoint(tmp_path):
    io = TorchCheckpointIO()
    path = tmp_path / "last.ckpt"
    io.save_checkpoint({"step": 1}, path)
    io.save_checkpoint({"step": 2}, path)
    assert io.load_checkpoint(path)["step"] == 2


def test_failed_save_leaves_the_previous_checkpoint_and_no_temp_file(tmp_path):
    io = TorchCheckpointIO()
    path = tmp_path / "last.ckpt"
    io.save_checkpoint({"weights": torch.arange(4.0)}, path)
    bomb = ExplodingPickle(tmp_path)
    with pytest.raises(RuntimeError, match="cannot pickle this"):
        io.save_checkpoint({"weights": torch.zeros(1000), "bomb": bomb}, path)
    # The write was under way (a temp file next to the target) when it failed …
    assert len(bomb.files_seen) == 2 and any(".drivetrain-partial-" in name for name in bomb.files_seen)
    # … and the failure left the old checkpoint whole and the directory clean.
    assert os.listdir(tmp_path) == ["last.ckpt"]
    assert torch.equal(io.load_checkpoint(path)["weights"], torch.arange(4.0))


def test_saved_file_gets_the_usual_permissions(tmp_path):
    previous = os.umask(0o022)
    try:
        TorchCheckpointIO().save_checkpoint({"a": 1}, tmp_path / "c.ckpt")
    finally:
        os.umask(previous)
    assert (tmp_path / "c.ckpt").stat().st_mode & 0o777 == 0o644


def test_storage_options_are_rejected(tmp_path):
    with pytest.raises(TypeError, match="takes storage_options for remote paths"):
        TorchCheckpointIO().save_checkpoint({"a": 1}, tmp_path / "c.ckpt", storage_options={"s3": 1})
    assert not (tmp_path / "c.ckpt").exists()


def test_weights_only_refuses_unknown_classes_unless_the_caller_opts_out(tmp_path):
    io = TorchCheckpointIO()
    path = tmp_path / "c.ckpt"
    io.save_checkpoint({"thing": Opaque(7)}, path)
    with pytest.raises(pickle.UnpicklingError) as excinfo:
        io.load_checkpoint(path)
    message = str(excinfo.value)
    assert "Opaque" in message
    assert "add_safe_globals" in message and "weights_only=False" in message
    assert io.load_checkpoint(path, weights_only=False)["thing"].value == 7
    with torch.serialization.safe_globals([Opaque]):
        assert io.load_checkpoint(path)["thing"].value == 7


def test_map_location(tmp_path):
    io = TorchCheckpointIO()
    io.save_checkpoint({"w": torch.ones(2)}, tmp_path / "c.ckpt")
    assert io.load_checkpoint(tmp_path / "c.ckpt", map_location="meta")["w"].device.type == "meta"


def test_missing_checkpoint_names_the_path(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"nope\.ckpt"):
        TorchCheckpointIO().load_checkpoint(tmp_path / "nope.ckpt")


def test_remove_file_directory_and_missing_path(tmp_path):
    io = TorchCheckpointIO()
    file = tmp_path / "c.ckpt"
    io.save_checkpoint({"a": 1}, file)
    io.remove_checkpoint(file)
    assert not file.exists()
    io.remove_checkpoint(file)  # already gone: fine

    sharded = tmp_path / "sharded"
    (sharded / "sub").mkdir(parents=True)
    (sharded / "sub" / "shard0").write_bytes(b"0")
    io.remove_checkpoint(str(sharded))
    assert not sharded.exists()


def test_remove_a_link_to_a_directory_keeps_the_target(tmp_path):
    target = tmp_path / "real"
    target.mkdir()
    (target / "shard0").write_bytes(b"0")
    link = tmp_path / "link"
    link.symlink_to(target, target_is_directory=True)
    TorchCheckpointIO().remove_checkpoint(link)
    assert not link.exists() and (target / "shard0").exists()
