"""Reading ``torch.distributed.checkpoint`` (DCP) folders without unpickling anything unsafe.

torch's ``FileSystemReader`` reads a folder's ``.metadata`` with plain ``pickle.load``, and its
``DefaultLoadPlanner`` reads non-tensor entries (optimizer hyperparameters …) with
``torch.load(weights_only=False)``: a planted pickle in either runs code. The reader and
planners here replace exactly those two steps; everything else is torch's. Pass them to
``torch.distributed.checkpoint.load`` (``storage_reader=`` and ``planner=``). Remote folders
(fsspec URLs) are read through torch's fsspec reader with the same safe metadata step
(:func:`storage_reader`).
"""

from __future__ import annotations

import functools
import io
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from torch.distributed.checkpoint import DefaultLoadPlanner, FileSystemReader
from torch.distributed.checkpoint.planner import ReadItem

from drivetrain._utilities import paths
from drivetrain.plugins.io.safe_loading import check_pickled_bytes, load_dcp_metadata, read_dcp_metadata


class SafeMetadataMixin:
    """Read a DCP folder's ``.metadata`` with the allow-list unpickler instead of ``pickle.load``."""

    fs: Any
    load_id: Any
    _get_metadata_path: Any  # torch's reader provides it

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


class SafeFileSystemReader(SafeMetadataMixin, FileSystemReader):
    """torch's ``FileSystemReader`` (local folders) with the metadata read by an allow-list unpickler."""


def storage_reader(
    folder: str | os.PathLike[str], *, weights_only: bool = True, storage_options: Any = None
) -> Any:
    """The DCP reader for ``folder``: local or remote (fsspec), safe unless ``weights_only=False``."""
    if paths.is_remote(folder):
        from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader

        # torch's fsspec reader takes the filesystem's options as keyword arguments.
        options = dict(storage_options or {})
        if weights_only:
            return _safe_fsspec_reader_class()(os.fspath(folder), **options)
        return FsspecReader(os.fspath(folder), **options)
    if weights_only:
        return SafeFileSystemReader(paths.normalize(folder))
    return FileSystemReader(paths.normalize(folder))


def storage_writer(folder: str | os.PathLike[str], storage_options: Any = None) -> Any:
    """The DCP writer for ``folder``: torch's own, local or remote (fsspec)."""
    if paths.is_remote(folder):
        from torch.distributed.checkpoint._fsspec_filesystem import FsspecWriter

        return FsspecWriter(os.fspath(folder), **dict(storage_options or {}))
    from torch.distributed.checkpoint import FileSystemWriter

    return FileSystemWriter(paths.normalize(folder))


@functools.cache
def _safe_fsspec_reader_class() -> Any:
    # Made on first use: torch's fsspec module imports fsspec, which local checkpoints never need.
    from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader

    class SafeFsspecReader(SafeMetadataMixin, FsspecReader):
        """torch's fsspec reader (remote folders) with the metadata read by an allow-list unpickler."""

    return SafeFsspecReader


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


def load_whole_dcp_folder(folder: str | os.PathLike[str], *, weights_only: bool = True) -> dict[str, Any]:
    """Every entry of a DCP folder (local or remote) as full tensors and plain values, in this one process.

    What ``torch.distributed.checkpoint.format_utils.dcp_to_torch_save`` loads, read safely
    unless ``weights_only=False``.
    """
    # torch rebuilds the nested state dict from the metadata with this planner; it has no public
    # equivalent. The safe-bytes override is ours.
    from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    class _SafeEmptyPlanner(SafeBytesMixin, _EmptyStateDictLoadPlanner):
        pass

    planner: Any
    if weights_only:
        read_dcp_metadata(folder)  # a clear error before DCP, which wraps every error it meets
        planner = _SafeEmptyPlanner()
        planner.checkpoint_path = os.fspath(folder)
    else:
        planner = _EmptyStateDictLoadPlanner()
    state: dict[str, Any] = {}
    reader = storage_reader(folder, weights_only=weights_only)
    with first_rank_error():
        _load_state_dict(state, storage_reader=reader, planner=planner, no_dist=True)
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
