"""Checkpoints as single files written with ``torch.save``: atomic writes, safe loads.

A write goes to a hidden temporary file next to the target, is flushed to disk, verified (a
complete archive) and only then renamed over the target, so a crash, a full disk or an
unpicklable object never leaves a truncated checkpoint where a good one was; what a crash left
behind is removed at the next save into the folder (see :mod:`drivetrain.plugins.io.atomic`).
Loads use ``torch.load(weights_only=True)``, which cannot run code from the file, unless the
caller opts out explicitly, and call a damaged file damaged.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from drivetrain._utilities import paths
from drivetrain.plugins.io.atomic import remove, tidy, write_file
from drivetrain.plugins.io.checkpoint_io import CheckpointIO
from drivetrain.plugins.io.safe_loading import check_torch_file, load_torch_file


class TorchCheckpointIO(CheckpointIO):
    """Save and load checkpoint dicts with ``torch.save`` / ``torch.load``, on local disks or remote storage.

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
        was there before is untouched and no temporary file is left behind. ``path`` may be
        remote (``s3://bucket/run/last.ckpt``, any fsspec URL).

        Args:
            storage_options: for a remote ``path``, the fsspec filesystem's options
                (``{"endpoint_url": ...}``, credentials ...).

        Raises:
            TypeError: if ``storage_options`` are given for a local path.
        """
        if paths.is_remote(path):
            paths.check(path, storage_options)  # an unknown scheme or a missing package, named with this path
        else:
            reject_storage_options(self, storage_options)
        tidy(paths.parent(path), storage_options)
        write_file(
            path,
            lambda file: torch.save(checkpoint, file),
            verify=lambda written: check_torch_file(written, storage_options),
            storage_options=storage_options,
        )

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
        idempotent, so a retried or repeated removal, or one racing another rank's, succeeds. A
        folder is renamed aside before it is deleted, so a crash never leaves half of it.
        """
        remove(path)


def reject_storage_options(io: CheckpointIO, storage_options: Any | None) -> None:
    """Raise if ``storage_options`` were given where they cannot apply (never ignore them silently)."""
    if storage_options is not None:
        raise TypeError(
            f"{type(io).__name__}.save_checkpoint takes storage_options for remote paths (s3://, gs:// ...) only, "
            f"got {storage_options!r} for a local one. Leave the argument out, or use a CheckpointIO that "
            f"understands them."
        )
