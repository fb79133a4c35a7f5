"""Saving and restoring: training state, models, objects; unwrapping and releasing.

A mixin of :class:`drivetrain.Accelerator`; the work is done in :mod:`drivetrain.facade.checkpointing`.
"""

from __future__ import annotations

import gc
import os
from pathlib import Path
from typing import Any

from torch import nn

from drivetrain.data import PreparedDataLoader, skip_first_batches
from drivetrain.facade import checkpointing
from drivetrain.facade.process_control import ProcessControl
from drivetrain.facade.wrappers import PrecisionForward, PreparedOptimizer, PreparedScheduler
from drivetrain.utils.configuration import ProjectConfiguration


class Persistence(ProcessControl):
    """``save_state``/``load_state``, ``save``, ``save_model``, ``unwrap_model``, ``free_memory`` (mixin)."""

    project_configuration: ProjectConfiguration
    _models: list[nn.Module]
    _optimizers: list[PreparedOptimizer]
    _schedulers: list[PreparedScheduler]
    _dataloaders: list[PreparedDataLoader]
    _custom_objects: list[Any]
    _prepared: dict[int, tuple[Any, Any]]
    _backward_module: nn.Module | None

    def unwrap_model(
        self, model: nn.Module, keep_fp32_wrapper: bool = True, keep_torch_compile: bool = True
    ) -> nn.Module:
        """The user's module inside the strategy's wrappers (and, unless asked, its precision wrapper)."""
        inner = self.strategy.unwrap_module(model)
        if not keep_fp32_wrapper and isinstance(inner.__dict__.get("forward"), PrecisionForward):
            del inner.forward
        if keep_torch_compile:
            outer: Any = model
            while isinstance(outer, nn.parallel.DistributedDataParallel):
                outer = outer.module
            if hasattr(outer, "_orig_mod"):
                return outer
        return inner

    def get_state_dict(self, model: nn.Module, unwrap: bool = True) -> dict[str, Any]:
        """``model``'s state dict as the strategy assembles it (whole, even when sharded)."""
        return checkpointing.model_state_dict(self, model)

    def register_for_checkpointing(self, *objects: Any) -> None:
        """Save and restore these objects (each with ``state_dict``/``load_state_dict``) in save/load_state."""
        invalid = [
            obj
            for obj in objects
            if not (
                callable(getattr(obj, "state_dict", None)) and callable(getattr(obj, "load_state_dict", None))
            )
        ]
        if invalid:
            raise TypeError(
                f"register_for_checkpointing needs objects with state_dict() and load_state_dict(); these have "
                f"not: {', '.join(f'{type(o).__name__} ({o!r:.40})' for o in invalid)}."
            )
        self._custom_objects.extend(objects)

    def save_state(
        self, output_dir: str | os.PathLike[str] | None = None, safe_serialization: bool = True, **kwargs: Any
    ) -> str:
        """Save models, optimizers, schedulers, loss scaler, RNG states, data positions and registered objects.

        Without ``output_dir`` the next automatic checkpoint is written
        (``ProjectConfiguration(automatic_checkpoint_naming=True)``). The state file is read with
        ``weights_only=True`` either way, so ``safe_serialization`` changes nothing.
        """
        _no_model_kwargs("save_state", kwargs)
        self._require_processes("save_state")
        return checkpointing.save_state(self, output_dir)

    def load_state(
        self,
        input_dir: str | os.PathLike[str] | None = None,
        load_kwargs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> str:
        """Restore what :meth:`save_state` saved; prepared loaders continue with the next unseen batch.

        Args:
            input_dir: the directory :meth:`save_state` wrote; ``None`` loads the newest complete
                automatic checkpoint.
            load_kwargs: ``{"weights_only": False}`` unpickles the state without restrictions,
                which can run code from the files: only for checkpoints from a trusted source.
                By default only tensors, plain values and allow-listed classes are read.
        """
        _no_model_kwargs("load_state", kwargs)
        weights_only = _weights_only(load_kwargs)
        self._require_processes("load_state")
        return checkpointing.load_state(self, input_dir, weights_only=weights_only)

    def save(self, obj: Any, f: str | os.PathLike[str], safe_serialization: bool = False) -> None:
        """Save ``obj`` once (main process; each node's with ``save_on_each_node``), atomically."""
        writer = (
            self.is_local_main_process
            if self.project_configuration.save_on_each_node
            else self.is_main_process
        )
        if writer:
            checkpointing.save_object(obj, f, safe_serialization)

    def save_model(
        self,
        model: nn.Module,
        save_directory: str | os.PathLike[str],
        max_shard_size: int | str = "10GB",
        safe_serialization: bool = True,
    ) -> None:
        """Save ``model``'s weights to ``save_directory`` (``model.safetensors``, sharded past ``max_shard_size``)."""
        directory = Path(save_directory)
        if directory.is_file():
            raise ValueError(f"save_model expects a directory, but '{directory}' is a file.")
        state_dict = self.get_state_dict(model)
        if self.is_main_process:
            checkpointing.write_model(state_dict, directory, max_shard_size, safe_serialization)

    def skip_first_batches(self, dataloader: Any, num_batches: int = 0) -> Any:
        """A loader whose next epoch starts ``num_batches`` batches in (see :func:`drivetrain.data.skip_first_batches`)."""
        return skip_first_batches(dataloader, num_batches)

    def free_memory(self, *objects: Any) -> list[None]:
        """Forget every prepared object (and ``objects``), then collect garbage; returns ``None`` per object."""
        self._models.clear()
        self._optimizers.clear()
        self._schedulers.clear()
        self._dataloaders.clear()
        self._prepared.clear()
        self._backward_module = None
        self.strategy.model = None
        self.gradient_state.step = 0
        gc.collect()
        return [None] * len(objects)

    clear = free_memory


def _no_model_kwargs(method: str, kwargs: dict[str, Any]) -> None:
    if kwargs:
        raise TypeError(
            f"{method}() got {', '.join(map(repr, kwargs))}: drivetrain saves models through the strategy and takes "
            f"no model-saving options here."
        )


def _weights_only(load_kwargs: dict[str, Any] | None) -> bool:
    if load_kwargs is None:
        return True
    if not isinstance(load_kwargs, dict):
        raise TypeError(f"load_state(load_kwargs=...) expects a dict, got {type(load_kwargs).__name__}.")
    unknown = sorted(set(load_kwargs) - {"weights_only"})
    if unknown:
        raise ValueError(
            f"load_state(load_kwargs=...) got {', '.join(map(repr, unknown))}; drivetrain loads through the "
            f"strategy and takes only 'weights_only' here (e.g. load_kwargs={{'weights_only': False}})."
        )
    value = load_kwargs.get("weights_only", True)
    if not isinstance(value, bool):
        raise TypeError(f"load_state(load_kwargs={{'weights_only': {value!r}}}): use True or False.")
    return value
