"""How a checkpoint dict reaches storage and comes back."""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any


class CheckpointIO(ABC):
    """Save, load and remove checkpoints; a Strategy decides which ranks call it."""

    @abstractmethod
    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: str | Path, storage_options: Any | None = None
    ) -> None:
        """Write ``checkpoint`` to ``path``."""

    @abstractmethod
    def load_checkpoint(self, path: str | Path, map_location: Any | None = None) -> dict[str, Any]:
        """Read the checkpoint at ``path``."""

    @abstractmethod
    def remove_checkpoint(self, path: str | Path) -> None:
        """Delete the checkpoint at ``path``."""

    def teardown(self) -> None:
        """Finish pending work and release resources."""
