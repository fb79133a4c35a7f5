"""Checkpoints as single files written with ``torch.save``: atomic writes, safe loads.

A write goes to a temporary file next to the target and is renamed over it only once it is
complete and on disk, so a crash, a full disk or an unpicklable object never leaves a truncated
checkpoint where a good one was. Loads use ``torch.load(weights_only=True)``, which cannot run
code from the file, unless the caller opts out explicitly.
"""

from __future__ import annotations

import os
import secrets
import shutil
from pathlib import Path
from typing import Any

import torch

from drivetrain.plugins.io.checkpoint_io import CheckpointIO
from drivetrain.plugins.io.safe_loading import load_torch_file


class TorchCheckpointIO(CheckpointIO):
    """Save and load checkpoint dicts with ``torch.save`` / ``torch.load`` on a local file system.

    Example:
        >>> io = TorchCheckpointIO()
        >>> io.save_checkpoint({"step": 3}, "runs/last.ckpt")  # doctest: +SKIP
        >>> io.load_checkpoint("runs/last.ckpt")["step"]  # doctest: +SKIP
        3
    """

    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: str | Path, storage_options: Any | None = None
    ) -> None:
        """Write ``checkpoint`` to ``path`` atomically, creating parent directories.

        Either the complete new checkpoint is at ``path`` afterwards, or (on any error) whatever
        was there before is untouched and no temporary file is left behind.

        Raises:
            TypeError: if ``storage_options`` is given; this IO has none.
        """
        reject_storage_options(self, storage_options)
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        # A unique hidden name in the target's directory: os.replace is atomic only within one file
        # system, and concurrent writers (two ranks, two runs) must not share a temp file. Opened
        # with "xb" rather than mkstemp so the file gets the usual umask permissions, not 0600.
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
        try:
            with open(tmp, "xb") as file:
                torch.save(checkpoint, file)
                file.flush()
                os.fsync(file.fileno())
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        _fsync_directory(path.parent)

    def load_checkpoint(
        self, path: str | Path, map_location: Any | None = None, *, weights_only: bool = True
    ) -> dict[str, Any]:
        """Read the checkpoint at ``path``.

        Args:
            path: the file ``save_checkpoint`` wrote.
            map_location: where to put the tensors, as for ``torch.load`` (e.g. ``"cpu"``).
            weights_only: keep ``True`` unless the file comes from a trusted source: with
                ``False`` unpickling can run arbitrary code.

        Raises:
            FileNotFoundError: if there is nothing at ``path``.
            DamagedCheckpointError: the file is empty, truncated or not a checkpoint.
            UnsafeCheckpointError: (a ``pickle.UnpicklingError``) the file holds objects
                ``weights_only`` loading refuses; the message says how to allow them.
        """
        return load_torch_file(path, map_location=map_location, weights_only=weights_only)

    def remove_checkpoint(self, path: str | Path) -> None:
        """Delete the checkpoint file (or sharded checkpoint directory) at ``path``.

        A missing ``path`` is not an error: cleanup of old checkpoints (keeping the top k) must be
        idempotent, so a retried or repeated removal, or one racing another rank's, succeeds.
        """
        path = Path(path)
        if path.is_dir() and not path.is_symlink():
            try:
                shutil.rmtree(path)
            except FileNotFoundError:  # removed concurrently (another rank's cleanup)
                pass
        else:
            path.unlink(missing_ok=True)


def reject_storage_options(io: CheckpointIO, storage_options: Any | None) -> None:
    """Raise if ``storage_options`` were given to an IO that takes none (never ignore them silently)."""
    if storage_options is not None:
        raise TypeError(
            f"{type(io).__name__}.save_checkpoint takes no storage_options, got {storage_options!r}. "
            f"Leave the argument out, or use a CheckpointIO that understands them."
        )


def _fsync_directory(directory: Path) -> None:
    # The rename is durable only once the directory entry is on disk. Some platforms (Windows)
    # cannot open a directory for fsync; the rename is still atomic there.
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
