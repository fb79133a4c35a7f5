"""Safe loading: planted pickles never run, damaged files are called damaged, the opt-out is explicit."""

from __future__ import annotations

import io
import os
import pickle
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

from drivetrain.plugins.io import TorchCheckpointIO
from drivetrain.plugins.io.dcp import (
    SafeFileSystemReader,
    SafeLoadPlanner,
    first_rank_error,
    load_whole_dcp_folder,
)
from drivetrain.plugins.io.safe_loading import (
    DamagedCheckpointError,
    UnsafeCheckpointError,
    check_torch_file,
    read_dcp_metadata,
)
from helpers.planted import Payload, add_dcp_bytes_entry, plant_in_dcp_metadata, plant_in_torch_file


def _checkpoint_file(path: Path) -> Path:
    torch.manual_seed(0)
    model = nn.Linear(8, 4)
    TorchCheckpointIO().save_checkpoint({"state_dict": model.state_dict(), "epoch": 1}, path)
    return path


def _dcp_folder(folder: Path) -> Path:
    import torch.distributed.checkpoint as dcp

    torch.manual_seed(0)
    model = nn.Linear(8, 4)
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.randn(2, 8)).sum().backward()
    optimizer.step()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*assuming the intent is to save in a single process")
        dcp.save(
            {"model": model.state_dict(), "optimizer": optimizer.state_dict()}, checkpoint_id=str(folder)
        )
    return folder


def _assert_damaged(error: pytest.ExceptionInfo[BaseException], path: Path) -> None:
    message = str(error.value)
    assert "is damaged or not a checkpoint" in message and str(path) in message
    assert "weights_only" not in message  # not advice to turn safe loading off


# -- torch.save files ---------------------------------------------------------------------------
def test_a_planted_pickle_is_refused_and_never_runs(tmp_path: Path) -> None:
    path, marker = _checkpoint_file(tmp_path / "c.ckpt"), tmp_path / "ran"
    plant_in_torch_file(path, marker)
    with pytest.raises(UnsafeCheckpointError) as error:
        TorchCheckpointIO().load_checkpoint(path)
    assert not marker.exists()
    assert "exec" in str(error.value) and "weights_only=False" in str(error.value)
    assert isinstance(error.value, pickle.UnpicklingError)
    # The explicit opt-out does unpickle it: the refusal above was the loader's doing.
    TorchCheckpointIO().load_checkpoint(path, weights_only=False)
    assert marker.exists()


@pytest.mark.parametrize(
    "damage",
    ["empty", "truncated", "random", "text", "zip_of_other_things", "cut_in_the_middle"],
)
def test_damaged_files_are_reported_as_damaged(tmp_path: Path, damage: str) -> None:
    path = _checkpoint_file(tmp_path / "c.ckpt")
    data = path.read_bytes()
    if damage == "empty":
        path.write_bytes(b"")
    elif damage == "truncated":
        path.write_bytes(data[: len(data) // 2])
    elif damage == "random":
        path.write_bytes(os.urandom(4096))
    elif damage == "text":
        path.write_text("not a checkpoint\n")
    elif damage == "cut_in_the_middle":
        path.write_bytes(data[:100] + data[-200:])
    else:
        import zipfile

        with zipfile.ZipFile(path, "w") as archive:
            archive.writestr("readme.txt", "hello")
    with pytest.raises(DamagedCheckpointError) as error:
        TorchCheckpointIO().load_checkpoint(path)
    _assert_damaged(error, path)
    assert isinstance(error.value, ValueError)


def test_a_zip_whose_pickle_is_garbled_is_damaged_not_unsafe(tmp_path: Path) -> None:
    import zipfile

    path = _checkpoint_file(tmp_path / "c.ckpt")
    garbled = tmp_path / "g.ckpt"
    with zipfile.ZipFile(path) as source, zipfile.ZipFile(garbled, "w", zipfile.ZIP_STORED) as target:
        for info in source.infolist():
            data = source.read(info)
            target.writestr(info, b"\xff\xfe garbage" if info.filename.endswith("data.pkl") else data)
    with pytest.raises(DamagedCheckpointError) as error:
        TorchCheckpointIO().load_checkpoint(garbled)
    _assert_damaged(error, garbled)


def test_a_legacy_format_file_still_loads(tmp_path: Path) -> None:
    path = tmp_path / "legacy.pt"
    torch.save({"w": torch.ones(3)}, path, _use_new_zipfile_serialization=False)
    check_torch_file(path)
    assert torch.equal(TorchCheckpointIO().load_checkpoint(path)["w"], torch.ones(3))


def test_a_folder_is_not_a_checkpoint_file(tmp_path: Path) -> None:
    with pytest.raises(IsADirectoryError, match="sharded checkpoint"):
        TorchCheckpointIO().load_checkpoint(tmp_path)


def test_errors_survive_pickling_between_ranks(tmp_path: Path) -> None:
    damaged = pickle.loads(pickle.dumps(DamagedCheckpointError(tmp_path, "the file is empty")))
    assert str(damaged) == str(DamagedCheckpointError(tmp_path, "the file is empty"))
    unsafe = pickle.loads(pickle.dumps(UnsafeCheckpointError(tmp_path, "os.system", "--no-weights-only")))
    assert "--no-weights-only" in str(unsafe) and unsafe.refused == "os.system"


# -- torch.distributed.checkpoint folders -------------------------------------------------------
def test_planted_dcp_metadata_is_refused_and_never_runs(tmp_path: Path) -> None:
    folder, marker = _dcp_folder(tmp_path / "dcp"), tmp_path / "ran"
    plant_in_dcp_metadata(folder, marker)
    with pytest.raises(UnsafeCheckpointError, match=r"builtins\.exec"):
        read_dcp_metadata(folder)
    with pytest.raises(UnsafeCheckpointError):
        SafeFileSystemReader(str(folder)).read_metadata()
    with pytest.raises(UnsafeCheckpointError):
        load_whole_dcp_folder(folder)
    assert not marker.exists()


def test_clean_dcp_metadata_reads_like_torchs(tmp_path: Path) -> None:
    from torch.distributed.checkpoint import FileSystemReader

    folder = _dcp_folder(tmp_path / "dcp")
    ours, theirs = read_dcp_metadata(folder), FileSystemReader(str(folder)).read_metadata()
    assert ours.state_dict_metadata == theirs.state_dict_metadata
    assert ours.storage_data == theirs.storage_data
    whole = load_whole_dcp_folder(folder)
    assert torch.equal(whole["model"]["weight"], _reference_weight())
    assert whole["optimizer"]["param_groups"][0]["lr"] == 1e-3


def _reference_weight() -> torch.Tensor:
    torch.manual_seed(0)
    model = nn.Linear(8, 4)
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.randn(2, 8)).sum().backward()
    optimizer.step()
    return model.weight.detach()


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")
def test_a_planted_non_tensor_entry_is_refused_by_the_planner(tmp_path: Path) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import DefaultLoadPlanner

    folder, marker = _dcp_folder(tmp_path / "dcp"), tmp_path / "ran"
    add_dcp_bytes_entry(folder, "planted", Payload(marker))
    with pytest.raises(UnsafeCheckpointError, match="planted"):
        load_whole_dcp_folder(folder)
    target: dict[str, object] = {"planted": None}
    with pytest.raises(UnsafeCheckpointError), first_rank_error():
        dcp.load(
            target,
            storage_reader=SafeFileSystemReader(str(folder)),
            planner=SafeLoadPlanner(folder),
            no_dist=True,
        )
    assert not marker.exists()
    # torch's own planner runs it: this is the hole the safe planner closes.
    dcp.load(
        target, storage_reader=SafeFileSystemReader(str(folder)), planner=DefaultLoadPlanner(), no_dist=True
    )
    assert marker.exists()


@pytest.mark.parametrize("damage", ["empty_metadata", "truncated_metadata", "missing_shard", "short_shard"])
def test_damaged_dcp_folders_are_reported_as_damaged(tmp_path: Path, damage: str) -> None:
    folder = _dcp_folder(tmp_path / "dcp")
    metadata = folder / ".metadata"
    shard = next(folder.glob("*.distcp"))
    if damage == "empty_metadata":
        metadata.write_bytes(b"")
    elif damage == "truncated_metadata":
        metadata.write_bytes(metadata.read_bytes()[:40])
    elif damage == "missing_shard":
        shard.unlink()
    else:
        shard.write_bytes(shard.read_bytes()[:10])
    with pytest.raises(DamagedCheckpointError) as error:
        read_dcp_metadata(folder)
    assert "is damaged or not a checkpoint" in str(error.value) and "weights_only" not in str(error.value)


def test_check_pickled_bytes_rewinds(tmp_path: Path) -> None:
    from drivetrain.plugins.io.safe_loading import check_pickled_bytes

    buffer = io.BytesIO()
    torch.save({"lr": 0.1}, buffer)
    buffer.seek(0)
    check_pickled_bytes(buffer, "x")
    assert buffer.tell() == 0 and torch.load(buffer, weights_only=True) == {"lr": 0.1}
