"""``OnExceptionCheckpoint``: save the state of a fit that ends with an exception, to resume from it."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from drivetrain._utilities import paths
from drivetrain._utilities.log import get_logger
from drivetrain.trainer.callbacks.callback import Callback
from drivetrain.trainer.callbacks.model_checkpoint import _ONE_PROCESS_ONLY

if TYPE_CHECKING:
    from drivetrain.trainer.module import TrainingModule
    from drivetrain.trainer.trainer import Trainer

_log = get_logger(__name__)


class OnExceptionCheckpoint(Callback):
    """Write ``<dirpath>/<filename>.ckpt`` when fit ends with an exception (``KeyboardInterrupt`` included).

    The file holds the state at that moment (the batch that raised is not counted), so
    ``trainer.fit(model, ckpt_path=callback.ckpt_path)`` continues from there. A later fit that
    finishes without an exception deletes it, as it no longer describes the run. The file is written
    like every checkpoint (to a temporary name, checked, then published), so a crash while writing
    leaves the previous one intact.

    Runs of one process only: with several, an exception in one process leaves the others elsewhere
    in the loop, so no complete checkpoint exists at that moment (an error at fit start says so).

    Args:
        dirpath: the folder to write to.
        filename: the file name without the extension.
    """

    FILE_EXTENSION = ".ckpt"

    def __init__(self, dirpath: str | Path, filename: str = "on_exception") -> None:
        if not filename or not isinstance(filename, str):
            raise ValueError(f"OnExceptionCheckpoint(filename={filename!r}); use a non-empty file name.")
        if os.sep in filename or filename.endswith(self.FILE_EXTENSION):
            raise ValueError(
                f"OnExceptionCheckpoint(filename={filename!r}) takes a name without folders or extension; "
                f"put the folder in dirpath."
            )
        self.dirpath = paths.normalize(dirpath)
        paths.check(self.dirpath)  # s3://... without s3fs, or an unknown scheme: reported here
        self.filename = filename
        self._saved = False

    @property
    def ckpt_path(self) -> str:
        """Where the checkpoint is written."""
        return paths.join(self.dirpath, self.filename + self.FILE_EXTENSION)

    def setup(self, trainer: Trainer, pl_module: TrainingModule, stage: str) -> None:

        if stage == "fit" and trainer.world_size > 1:
            raise ValueError(_ONE_PROCESS_ONLY.format(what="OnExceptionCheckpoint", n=trainer.world_size))
        self._saved = False

    def on_exception(self, trainer: Trainer, pl_module: TrainingModule, exception: BaseException) -> None:
        if (
            trainer.state.fn is None
            or trainer.state.fn.value != "fit"
            or not (trainer.training or trainer.validating)
        ):
            return  # not inside the fit loop (set-up, restoring, sanity check): nothing new to save
        trainer.save_checkpoint(self.ckpt_path)
        self._saved = True
        _log.info(
            f"{type(exception).__name__} ended the fit; saved the state at that moment to {self.ckpt_path}"
        )

    def teardown(self, trainer: Trainer, pl_module: TrainingModule, stage: str) -> None:
        if stage == "fit" and not self._saved and not trainer.interrupted:
            from drivetrain.plugins.io.atomic import resolve

            if resolve(self.ckpt_path) is not None:
                trainer.strategy.remove_checkpoint(self.ckpt_path)

    def state_dict(self) -> dict[str, Any]:
        return {"dirpath": self.dirpath, "filename": self.filename}
