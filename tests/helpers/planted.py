"""Planted pickles: checkpoints that run code when unpickled without restrictions.

The payload writes a marker file. A test plants it into a real checkpoint, loads the checkpoint
through a public entry point and asserts the marker never appears (and that the opt-out, when
asked for, does run it, so the test can tell a refused payload from a payload that never fired).
"""

from __future__ import annotations

import io
import os
import pickle
from pathlib import Path
from typing import Any

import torch


class Payload:
    """Unpickling this object runs ``exec``, which writes ``marker``."""

    def __init__(self, marker: str | Path) -> None:
        self.marker = str(marker)

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        code = f"with open({self.marker!r}, 'w') as f: f.write('the planted pickle ran')"
        return exec, (code,)


class SystemPayload:
    """Unpickling this object runs ``os.system`` (pickled as ``posix.system``), which writes ``marker``."""

    def __init__(self, marker: str | Path) -> None:
        self.marker = str(marker)

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return os.system, (f"echo the planted pickle ran > '{self.marker}'",)


def plant_in_torch_file(path: str | Path, marker: str | Path, payload: type[Any] = Payload) -> None:
    """Add the payload to a ``torch.save`` file (its other entries stay loadable)."""
    checkpoint = torch.load(
        path, weights_only=False
    )  # the test's own, trusted file (DeepSpeed's hold its classes)
    checkpoint["planted"] = payload(marker)
    torch.save(checkpoint, path)


def plant_in_dcp_metadata(folder: str | Path, marker: str | Path) -> None:
    """Attach the payload to the ``.metadata`` of a torch.distributed.checkpoint folder."""
    path = Path(folder) / ".metadata"
    with open(path, "rb") as file:
        metadata = pickle.load(file)  # the test's own, trusted file
    metadata.__dict__["planted"] = Payload(marker)
    with open(path, "wb") as file:
        pickle.dump(metadata, file)


def add_dcp_bytes_entry(folder: str | Path, key: str, value: Any) -> None:
    """Add a non-tensor entry ``key`` holding ``value`` to a DCP folder (its own data file, indexed in the metadata)."""
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata, MetadataIndex

    folder = Path(folder)
    buffer = io.BytesIO()
    torch.save(value, buffer)
    data = buffer.getvalue()
    (folder / "__planted_0.distcp").write_bytes(data)
    with open(folder / ".metadata", "rb") as file:
        metadata = pickle.load(file)
    metadata.state_dict_metadata[key] = BytesStorageMetadata()
    metadata.storage_data[MetadataIndex(key)] = _StorageInfo(
        relative_path="__planted_0.distcp", offset=0, length=len(data)
    )
    with open(folder / ".metadata", "wb") as file:
        pickle.dump(metadata, file)
