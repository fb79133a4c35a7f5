"""Saving models and objects from the Accelerator: ``save``, ``save_model``, ``get_state_dict``, ``unwrap_model``.

These write what a user exports (weights in Hugging Face's layout, any object), not the training
state (that is :mod:`drivetrain.facade.checkpointing`). Every file is written crash-safely (a
temporary file, flushed, then renamed).
"""

from __future__ import annotations

import json
import os
from typing import IO, TYPE_CHECKING, Any

import torch
from torch import nn

from drivetrain._utilities import paths
from drivetrain._utilities.sizes import parse_size

if TYPE_CHECKING:
    from drivetrain.facade.prepared import PreparedObjects
    from drivetrain.strategies.strategy import Strategy
    from drivetrain.utils.configuration import ProjectConfiguration
    from drivetrain.utils.dynamo import TorchDynamoPlugin


class ModelSaver:
    """``unwrap_model``, ``get_state_dict``, ``save``, ``save_model`` of one Accelerator.

    Args:
        strategy: unwraps and assembles models.
        objects: the Accelerator's prepared objects (the compiled views ``unwrap_model`` makes).
        project_configuration: ``save_on_each_node``.
        compiling: the settings ``prepare`` compiled models with (``None``: it compiled none).
    """

    def __init__(
        self,
        strategy: Strategy,
        objects: PreparedObjects,
        project_configuration: ProjectConfiguration,
        compiling: TorchDynamoPlugin | None,
    ) -> None:
        self.strategy = strategy
        self.objects = objects
        self.project_configuration = project_configuration
        self._compiling = compiling

    def unwrap_model(
        self, model: nn.Module, keep_fp32_wrapper: bool = True, keep_torch_compile: bool = True
    ) -> nn.Module:
        """See :meth:`drivetrain.Accelerator.unwrap_model`."""
        from drivetrain.utils.dynamo import compiled_inner
        from drivetrain.utils.modeling import finish_unwrap

        inner = self.strategy.unwrap_module(model)
        result = finish_unwrap(model, inner, keep_fp32_wrapper, keep_torch_compile)
        compiled = compiled_inner(model)
        if keep_torch_compile and result is inner and compiled is not None and compiled is not inner:
            view = self._compiled_view(model, inner)
            return result if view is None else view
        return result

    def _compiled_view(self, model: nn.Module, inner: nn.Module) -> nn.Module | None:
        """``torch.compile(inner)`` with the settings ``prepare`` compiled ``model`` with (made once)."""
        from drivetrain.utils.dynamo import compile_module

        prepared = self.objects.prepared.get(id(model))
        if self._compiling is None or prepared is None or prepared[1] is not model:
            return None  # compiled by the user around a wrapper: its settings are unknown here
        entry = self.objects.compiled_views.get(id(model))
        if entry is None or entry[0] is not model:
            entry = (model, compile_module(inner, self._compiling))
            self.objects.compiled_views[id(model)] = entry
        view: nn.Module = entry[1]
        return view

    def get_state_dict(self, model: nn.Module, unwrap: bool = True) -> dict[str, Any]:
        """See :meth:`drivetrain.Accelerator.get_state_dict`."""
        from drivetrain.big_modeling.dispatch import get_state_dict_offloaded_model, is_offloaded
        from drivetrain.utils.dynamo import uncompiled

        inner = self.strategy.unwrap_module(uncompiled(model))
        if is_offloaded(inner):
            return get_state_dict_offloaded_model(inner)
        return self.strategy.get_module_state_dict(uncompiled(model))

    def save(self, obj: Any, f: str | os.PathLike[str], safe_serialization: bool = False) -> None:
        """See :meth:`drivetrain.Accelerator.save`."""
        strategy = self.strategy
        writer = (
            strategy.local_rank == 0
            if self.project_configuration.save_on_each_node
            else strategy.is_global_zero
        )
        if writer:
            save_object(obj, f, safe_serialization)

    def save_model(
        self,
        model: nn.Module,
        save_directory: str | os.PathLike[str],
        max_shard_size: int | str = "10GB",
        safe_serialization: bool = True,
    ) -> None:
        """See :meth:`drivetrain.Accelerator.save_model`."""
        directory = paths.normalize(save_directory)
        paths.check(directory)
        if paths.isfile(directory):
            raise ValueError(f"save_model expects a directory, but '{directory}' is a file.")
        state_dict = self.get_state_dict(model)
        if self.strategy.is_global_zero:
            write_model(state_dict, directory, max_shard_size, safe_serialization)


def save_object(obj: Any, f: str | os.PathLike[str], safe_serialization: bool = False) -> None:
    """Write ``obj`` to ``f`` (local or remote) crash-safely, with ``torch.save`` or as safetensors."""
    from drivetrain.plugins.io.atomic import write_file

    if safe_serialization:
        write_file(f, lambda file: _write_safetensors(obj, file))
    else:
        write_file(f, lambda file: torch.save(obj, file))


def _write_safetensors(obj: Any, file: IO[bytes]) -> None:
    try:
        from safetensors.torch import save
    except ImportError:
        raise ImportError(
            "safe_serialization=True needs the 'safetensors' package: pip install safetensors (or pass "
            "safe_serialization=False to write with torch.save)."
        ) from None
    if not isinstance(obj, dict) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        raise TypeError(
            "safe_serialization=True writes a dict of tensors (a state dict); got "
            f"{type(obj).__name__}. Pass safe_serialization=False to save other objects with torch.save."
        )
    file.write(save(_unshared(obj), metadata={"format": "pt"}))


def _unshared(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Contiguous tensors, each with its own storage (safetensors refuses shared ones, e.g. tied weights)."""
    seen: set[tuple[Any, int]] = set()
    result = {}
    for name, tensor in state_dict.items():
        tensor = tensor.detach().contiguous()
        key = (tensor.device, tensor.untyped_storage().data_ptr()) if tensor.numel() else None
        if key is not None and key in seen:
            tensor = tensor.clone()
        elif key is not None:
            seen.add(key)
        result[name] = tensor
    return result


def write_model(
    state_dict: dict[str, torch.Tensor], directory: str, max_shard_size: int | str, safe_serialization: bool
) -> None:
    """Write a state dict as one file, or as shards with an index, in Hugging Face's layout (local or remote)."""
    limit = parse_size(max_shard_size, "max_shard_size")
    if limit == 0:
        raise ValueError("max_shard_size=0 leaves no room for a tensor; give a positive size such as '10GB'.")
    from drivetrain.utils import constants

    paths.makedirs(directory)
    single, pattern, index_name = (
        (constants.SAFE_WEIGHTS_NAME, constants.SAFE_WEIGHTS_PATTERN_NAME, constants.SAFE_WEIGHTS_INDEX_NAME)
        if safe_serialization
        else (constants.WEIGHTS_NAME, constants.WEIGHTS_PATTERN_NAME, constants.WEIGHTS_INDEX_NAME)
    )
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, tensor in state_dict.items():
        nbytes = tensor.numel() * tensor.element_size()
        if shards[-1] and size + nbytes > limit:
            shards.append({})
            size = 0
        shards[-1][name] = tensor
        size += nbytes
    if len(shards) == 1:
        save_object(shards[0], paths.join(directory, single), safe_serialization)
        return
    weight_map = {}
    for number, shard in enumerate(shards, start=1):
        filename = pattern.format(suffix=f"-{number:05d}-of-{len(shards):05d}")
        save_object(shard, paths.join(directory, filename), safe_serialization)
        weight_map.update(dict.fromkeys(shard, filename))
    total = sum(t.numel() * t.element_size() for t in state_dict.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    text = json.dumps(index, indent=2, sort_keys=True).encode()
    save_bytes(text, paths.join(directory, index_name))


def save_bytes(data: bytes, f: str) -> None:
    """Write ``data`` to ``f`` crash-safely."""
    from drivetrain.plugins.io.atomic import write_file

    write_file(f, lambda file: file.write(data))
