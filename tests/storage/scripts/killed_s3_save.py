"""A Trainer fit that saves to S3 and is killed (SIGKILL, by itself) in the middle of one checkpoint write.

    python killed_s3_save.py DIRPATH POINT WRITE [TOP_K]

``POINT`` is where the ``WRITE``-th checkpoint write dies: ``upload`` (after the first part of
its multipart upload reached the server) or ``publish`` (complete under its temporary key, just
before it is moved to its name). ``TOP_K`` is ModelCheckpoint's ``save_top_k`` (-1, every
checkpoint, by default); the checkpoints also save ``last.ckpt``. The kill is armed by wrapping s3fs's own upload and move
functions; everything else is the real program against the real (local) S3 server.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Any

import s3fs
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from drivetrain.trainer import ModelCheckpoint
from trainer.trainer_models import Regression, loader, quiet_trainer, regression_data

# S3's smallest part size (s3fs's default is 50 MiB): each checkpoint below is uploaded in two parts.
s3fs.S3FileSystem.default_block_size = 5 * 2**20


class Heavy(Regression):
    """Checkpoints larger than one upload part, so a write is a multipart upload."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("ballast", torch.zeros(2_000_000))


def arm(point: str, write: int) -> None:
    writes: list[str] = []

    def counted(path: str) -> bool:
        if ".drivetrain-partial-" not in path:
            return False
        if path not in writes:
            writes.append(path)
        return len(writes) == write

    if point == "upload":
        original_upload = s3fs.core.S3File._upload_chunk

        def upload(self: Any, final: bool = False) -> Any:
            result = original_upload(self, final)
            if counted(self.path) and not final:
                os.kill(os.getpid(), signal.SIGKILL)
            return result

        s3fs.core.S3File._upload_chunk = upload
    else:
        original_mv = s3fs.S3FileSystem.mv

        def mv(self: Any, source: str, destination: str, *args: Any, **kwargs: Any) -> Any:
            if counted(source):
                os.kill(os.getpid(), signal.SIGKILL)
            return original_mv(self, source, destination, *args, **kwargs)

        s3fs.S3FileSystem.mv = mv


def main() -> None:
    dirpath, point, write = sys.argv[1], sys.argv[2], int(sys.argv[3])
    top_k = int(sys.argv[4]) if len(sys.argv) > 4 else -1
    arm(point, write)
    torch.manual_seed(0)
    checkpoint = ModelCheckpoint(
        dirpath=dirpath, filename="{step}", save_top_k=top_k, every_n_train_steps=2, save_last=True
    )
    trainer = quiet_trainer(max_steps=6, enable_checkpointing=True, callbacks=[checkpoint])
    trainer.fit(Heavy(), loader(regression_data(32)))
    print("finished without being killed")


if __name__ == "__main__":
    main()
