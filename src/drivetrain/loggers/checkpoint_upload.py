"""Which checkpoints a tracker (W&B, MLflow) still has to upload, for their ``log_model`` option.

The checkpoint callback says which files it keeps (its top-k, its ``last`` and its best); a file
is uploaded once per version of it (``last.ckpt`` is rewritten, and uploaded again each time).
A checkpoint may be a file or, for sharded strategies, a folder.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from drivetrain._utilities.paths import is_remote


@dataclass(frozen=True)
class PendingCheckpoint:
    """One checkpoint to upload: where it is, how to tag it, and what to record with it."""

    path: str
    stamp: float
    aliases: list[str] = field(default_factory=list)
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def is_folder(self) -> bool:
        return os.path.isdir(self.path)


def _stamp(path: str) -> float:
    if os.path.isdir(path):
        stamps = [os.path.getmtime(os.path.join(root, f)) for root, _, files in os.walk(path) for f in files]
        return max(stamps, default=os.path.getmtime(path))
    return os.path.getmtime(path)


class CheckpointUploads:
    """Remembers the checkpoint callback and what has been uploaded (path and modification time)."""

    def __init__(self) -> None:
        self._callback: Any = None
        self._uploaded: dict[str, float] = {}

    def remember(self, checkpoint_callback: Any) -> None:
        self._callback = checkpoint_callback

    def pending(self) -> list[PendingCheckpoint]:
        """The callback's current checkpoints not yet uploaded in their current version, oldest first."""
        callback = self._callback
        if callback is None:
            return []
        scores: dict[str, Any] = dict(getattr(callback, "best_k_models", {}) or {})
        paths = list(scores)
        for extra in (getattr(callback, "last_model_path", ""), getattr(callback, "best_model_path", "")):
            if extra and extra not in paths:
                paths.append(extra)
        remote = [path for path in paths if is_remote(path)]
        if remote:
            raise ValueError(
                f"log_model uploads checkpoint files from the local disk, but the checkpoints are on remote storage "
                f"('{remote[0]}'). Save checkpoints to a local folder (ModelCheckpoint(dirpath=...)) to upload them, "
                f"or turn log_model off."
            )
        found = [(path, _stamp(path)) for path in paths if os.path.exists(path)]
        found = [(path, stamp) for path, stamp in found if self._uploaded.get(path) != stamp]
        best = getattr(callback, "best_model_path", "")
        checkpoints = []
        for path, stamp in sorted(found, key=lambda item: item[1]):
            score = scores.get(path)
            # What Lightning's W&B and MLflow loggers record with each checkpoint: its score, its file name,
            # and the callback's settings under the callback's class name.
            metadata = {
                "score": float(score) if score is not None else None,
                "original_filename": os.path.basename(path),
                type(callback).__name__: {
                    name: getattr(callback, name)
                    for name in ("monitor", "mode", "save_last", "save_top_k", "save_weights_only")
                    if hasattr(callback, name)
                },
            }
            aliases = ["latest"] + (["best"] if path == best else [])
            checkpoints.append(PendingCheckpoint(path, stamp, aliases, metadata))
        return checkpoints

    def done(self, checkpoint: PendingCheckpoint) -> None:
        self._uploaded[checkpoint.path] = checkpoint.stamp
