"""Accelerate's FSDP helpers: ``merge_fsdp_weights`` and ``save_fsdp_model``.

``merge_fsdp_weights(checkpoint_dir, output_path)`` turns a sharded training state into the model
weights of one process (what ``accelerate merge-weights`` writes): ``checkpoint_dir`` is a folder
``Accelerator.save_state`` wrote under a sharded strategy (or the sharded checkpoint in it),
``output_path`` the folder that receives ``model.safetensors`` (``pytorch_model.bin`` with
``safe_serialization=False``). ``save_fsdp_model`` writes a prepared model's full weights as
Accelerate's ``FULL_STATE_DICT`` file, ``pytorch_model_fsdp.bin``.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
from torch import nn

from drivetrain.strategies.checkpointing import model_key
from drivetrain.utils import constants

#: Accelerate's name for an FSDP model's file (``_<i>`` added for the model of index ``i`` > 0).
FSDP_MODEL_NAME = "pytorch_model_fsdp"


def merge_fsdp_weights(
    checkpoint_dir: str | os.PathLike[str],
    output_path: str | os.PathLike[str],
    safe_serialization: bool = True,
    remove_checkpoint_dir: bool = False,
    *,
    model_index: int = 0,
) -> Path:
    """Write the weights of the model in the sharded checkpoint ``checkpoint_dir`` to ``output_path/model.safetensors``.

    Args:
        checkpoint_dir: what ``Accelerator.save_state`` wrote under FSDP (or DeepSpeed), or the
            sharded checkpoint folder inside it.
        output_path: the folder to write into (created).
        safe_serialization: safetensors (``model.safetensors``); ``False``: ``pytorch_model.bin``.
        remove_checkpoint_dir: delete ``checkpoint_dir`` once the weights are written.
        model_index: which of the checkpoint's models (the order they were prepared in).

    Returns:
        The file written.

    Raises:
        FileNotFoundError, ValueError: no sharded checkpoint there, or no model of that index in it.
    """
    from drivetrain.strategies.consolidate import consolidate_checkpoint

    output = Path(output_path)
    if output.is_file():
        raise ValueError(f"merge_fsdp_weights writes into a folder, but {output} is a file; give a folder.")
    with tempfile.TemporaryDirectory(prefix="drivetrain-merge-") as scratch:
        merged = consolidate_checkpoint(os.fspath(checkpoint_dir), Path(scratch) / "merged.pt")
        state = torch.load(merged, map_location="cpu", weights_only=True)
    weights = state.get(model_key(model_index)) if isinstance(state, dict) else None
    if (
        weights is None
        and isinstance(state, dict)
        and all(isinstance(v, torch.Tensor) for v in state.values())
    ):
        weights = state  # a checkpoint of one model's tensors only
    if not isinstance(weights, dict):
        models = (
            sorted(key for key in state if isinstance(state.get(key), dict))
            if isinstance(state, dict)
            else []
        )
        raise ValueError(
            f"{checkpoint_dir} holds no model of index {model_index} (its entries: {models}); pass model_index=..."
        )
    output.mkdir(parents=True, exist_ok=True)
    if safe_serialization:
        from safetensors.torch import save_file

        target = output / constants.SAFE_WEIGHTS_NAME
        save_file(
            {name: tensor.contiguous() for name, tensor in weights.items()},
            str(target),
            metadata={"format": "pt"},
        )
    else:
        target = output / constants.WEIGHTS_NAME
        torch.save(weights, target)
    if remove_checkpoint_dir:
        shutil.rmtree(checkpoint_dir)
    return target


def save_fsdp_model(
    fsdp_plugin: Any,
    accelerator: Any,
    model: nn.Module,
    output_dir: str | os.PathLike[str],
    model_index: int = 0,
    adapter_only: bool = False,
) -> None:
    """Write ``model``'s full weights to ``output_dir/pytorch_model_fsdp.bin`` (``_<i>`` for ``model_index`` i > 0).

    Every process calls it (the weights are gathered); the main process writes the file, which
    loads with ``torch.load(..., weights_only=True)`` into the unwrapped model. This is Accelerate's
    ``FULL_STATE_DICT`` layout; a sharded state is ``accelerator.save_state``'s.

    Args:
        fsdp_plugin: Accelerate's plugin: ``None``, or one whose ``state_dict_type`` is the full
            state dict (the strategy decides the rest in drivetrain).
        accelerator: the ``drivetrain.Accelerator`` that prepared ``model``.
        model: the prepared model.
        output_dir: the folder to write into (created).
        model_index: the model's index, for the file name.
        adapter_only: PEFT adapters only: not supported.

    Raises:
        ValueError: a sharded ``state_dict_type`` or ``adapter_only=True``.
    """
    kind = str(getattr(fsdp_plugin, "state_dict_type", "FULL_STATE_DICT") or "FULL_STATE_DICT")
    if "FULL_STATE_DICT" not in kind.upper():
        raise ValueError(
            f"save_fsdp_model writes the full state dict; state_dict_type={kind} asks for another. Save a sharded "
            f"state with accelerator.save_state(dir) (merge it later with merge_fsdp_weights)."
        )
    if adapter_only:
        raise ValueError(
            "save_fsdp_model(adapter_only=True) is not supported: drivetrain has no PEFT integration."
        )
    weights = accelerator.get_state_dict(model)
    if accelerator.is_main_process:
        folder = Path(output_dir)
        folder.mkdir(parents=True, exist_ok=True)
        name = f"{FSDP_MODEL_NAME}.bin" if model_index == 0 else f"{FSDP_MODEL_NAME}_{model_index}.bin"
        temporary = folder / (name + ".tmp")
        torch.save({key: value.detach().cpu() for key, value in weights.items()}, temporary)
        os.replace(temporary, folder / name)
    accelerator.wait_for_everyone()
