"""Reading ``torch.distributed.checkpoint`` (DCP) folders without unpickling anything unsafe.

torch's ``FileSystemReader`` reads a folder's ``.metadata`` with plain ``pickle.load``, and its
``DefaultLoadPlanner`` reads non-tensor entries (optimizer hyperparameters …) with
``torch.load(weights_only=False)``: a planted pickle in either runs code. The reader and
planners here replace exactly those two steps; everything else is torch's. Pass them to
``torch.distributed.checkpoint.load`` (``storage_reader=`` and ``planner=``).
"""

from __future__ import annotations

import io
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from torch.distributed.checkpoint import DefaultLoadPlanner, FileSystemReader
from torch.distributed.checkpoint.planner import ReadItem

from drivetrain.plugins.io.safe_loading import check_pickled_bytes, load_dcp_metadata, read_dcp_metadata


class SafeFileSystemReader(FileSystemReader):
    """torch's ``FileSystemReader`` with the metadata read by an allow-list unpickler."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
        from torch.distributed.checkpoint.metadata import StorageMeta

        path = self._get_metadata_path(kwargs.get("rank"))
        with self.fs.create_stream(path, "rb") as stream:
            metadata = load_dcp_metadata(stream, path)
        # What torch's reader does after unpickling, so planners see the same object.
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


class SafeBytesMixin:
    """Prove each non-tensor entry harmless (``weights_only=True``) before DCP's planner unpickles it.

    The bytes are already in memory, so what was checked is exactly what the planner reads.
    """

    checkpoint_path: str = "<dcp checkpoint>"

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        check_pickled_bytes(value, f"{self.checkpoint_path} (entry {read_item.dest_index.fqn!r})")
        super().load_bytes(read_item, value)  # type: ignore[misc]


class SafeLoadPlanner(SafeBytesMixin, DefaultLoadPlanner):
    """``DefaultLoadPlanner`` whose non-tensor entries are read safely."""

    def __init__(self, checkpoint_path: str | os.PathLike[str], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.checkpoint_path = os.fspath(checkpoint_path)


def load_whole_dcp_folder(folder: str | os.PathLike[str]) -> dict[str, Any]:
    """Every entry of a DCP folder as full tensors and plain values, in this one process.

    What ``torch.distributed.checkpoint.format_utils.dcp_to_torch_save`` loads, read safely.
    """
    # torch rebuilds the nested state dict from the metadata with this planner; it has no public
    # equivalent. The safe-bytes override is ours.
    from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    class _SafeEmptyPlanner(SafeBytesMixin, _EmptyStateDictLoadPlanner):
        pass

    read_dcp_metadata(folder)  # a clear error before DCP, which wraps every error it meets
    planner = _SafeEmptyPlanner()
    planner.checkpoint_path = os.fspath(folder)
    state: dict[str, Any] = {}
    with first_rank_error():
        _load_state_dict(
            state, storage_reader=SafeFileSystemReader(os.fspath(folder)), planner=planner, no_dist=True
        )
    return state


@contextmanager
def first_rank_error() -> Iterator[None]:
    """Raise the error of the first failing rank rather than DCP's wrapper around every rank's (and its traceback text)."""
    from torch.distributed.checkpoint.api import CheckpointException

    try:
        yield
    except CheckpointException as error:
        failures = getattr(error, "failures", {}) or {}
        for rank in sorted(failures):
            cause = failures[rank]
            cause = cause[0] if isinstance(cause, tuple) and cause else cause
            if isinstance(cause, Exception):
                raise cause from None
        raise
