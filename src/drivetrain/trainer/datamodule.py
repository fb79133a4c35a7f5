"""``DataModule``: the data a Trainer run needs, in one reusable object.

``prepare_data`` runs once per node (download, tokenise, write to disk); ``setup(stage)`` runs in
every process (split, build datasets); the ``*_dataloader`` methods hand the loaders over.
Distributed samplers are inserted by the Trainer, so loaders are written as for one process.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

from drivetrain.trainer.hparams import AttributeDict, collect_hyperparameters


class DataModule:
    """Base class for data modules; override the methods you need."""

    def __init__(self) -> None:
        self.trainer: Any = None
        self._hparams = AttributeDict()

    def prepare_data(self) -> None:
        """Download or pre-process data; runs on local rank 0 of each node, before :meth:`setup`."""

    def setup(self, stage: str) -> None:
        """Build datasets for ``stage`` (``"fit"``, ``"validate"``, ``"test"``, ``"predict"``); every process."""

    def teardown(self, stage: str) -> None:
        """Release what :meth:`setup` took."""

    def train_dataloader(self) -> Any:
        """The training loader (or a list of batches, or any iterable)."""
        raise NotImplementedError(f"{type(self).__name__} does not define train_dataloader().")

    def val_dataloader(self) -> Any:
        """The validation loader, or a list of them."""
        raise NotImplementedError(f"{type(self).__name__} does not define val_dataloader().")

    def test_dataloader(self) -> Any:
        """The test loader, or a list of them."""
        raise NotImplementedError(f"{type(self).__name__} does not define test_dataloader().")

    def predict_dataloader(self) -> Any:
        """The prediction loader, or a list of them."""
        raise NotImplementedError(f"{type(self).__name__} does not define predict_dataloader().")

    def state_dict(self) -> dict[str, Any]:
        """State to save in checkpoints (e.g. a position in a stream)."""
        return {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""

    @property
    def hparams(self) -> AttributeDict:
        return self.__dict__.setdefault("_hparams", AttributeDict())

    def save_hyperparameters(self, *args: Any, ignore: str | Sequence[str] | None = None) -> None:
        """Save ``__init__``'s arguments as :attr:`hparams` (logged with the module's)."""
        frame = inspect.currentframe()
        caller = frame.f_back if frame is not None else None
        try:
            self.hparams.update(collect_hyperparameters(args, caller, ignore))
        finally:
            del frame, caller

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["trainer"] = None
        return state
