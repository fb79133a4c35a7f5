"""What one Accelerator has prepared and registered: the registry its parts share.

``Accelerator.prepare`` fills it; the checkpointing, model-saving and stepping code read it. It is
owned by the Accelerator (never module-level state), so two Accelerators in one process keep their
objects apart.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import nn

    from drivetrain.data.loader import PreparedDataLoader
    from drivetrain.facade.wrappers import PreparedOptimizer, PreparedScheduler


class PreparedObjects:
    """The prepared models, optimizers, schedulers and loaders, and the objects registered for checkpointing."""

    def __init__(self) -> None:
        self.models: list[nn.Module] = []
        self.optimizers: list[PreparedOptimizer] = []
        self.schedulers: list[PreparedScheduler] = []
        self.dataloaders: list[PreparedDataLoader] = []
        #: Objects given to ``register_for_checkpointing``.
        self.custom_objects: list[Any] = []
        #: id -> (an object given to ``prepare``, what it became): nothing is prepared twice.
        self.prepared: dict[int, tuple[Any, Any]] = {}
        #: id -> (a prepared model compiled around its wrapper, ``unwrap_model``'s compiled view of it).
        self.compiled_views: dict[int, tuple[nn.Module, nn.Module]] = {}
        #: The model ``backward`` runs through (the first one prepared for training).
        self.backward_module: nn.Module | None = None

    def known(self, obj: Any) -> Any:
        """What ``obj`` was prepared into (or ``obj`` itself if it is a prepared result), else ``None``."""
        entry = self.prepared.get(id(obj))
        return entry[1] if entry is not None and entry[0] is obj else None

    def remember(self, result: Any, *keys: Any) -> None:
        """Record that ``keys`` were prepared into ``result`` (each key object is kept: ids are reused)."""
        for key in keys:
            self.prepared[id(key)] = (key, result)

    def clear(self) -> None:
        """Forget every prepared object (``free_memory``); registered objects stay registered."""
        self.models.clear()
        self.optimizers.clear()
        self.schedulers.clear()
        self.dataloaders.clear()
        self.prepared.clear()
        self.compiled_views.clear()
        self.backward_module = None
