"""Reading model checkpoints shard by shard, and the folder that holds weights offloaded to disk.

A checkpoint is one file (``.safetensors``, or a torch file read with ``weights_only=True``), a
sharded checkpoint's index (``*.index.json`` with a ``weight_map`` of tensor name -> shard
file), or a folder holding exactly one of those. Shards are read one at a time, so loading a
model never holds more than one shard in memory beyond the model itself.

Offloaded weights live in a folder with one safetensors file per tensor and an ``index.json``;
they are memory-mapped when read back.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator, Mapping
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import Tensor

_TORCH_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt")


def checkpoint_shards(checkpoint: str | os.PathLike[str]) -> list[Path]:
    """The files of ``checkpoint`` in load order.

    Raises:
        FileNotFoundError: nothing at ``checkpoint``.
        ValueError: a folder without a checkpoint (or with several), or an index without a weight map.
    """
    path = Path(checkpoint)
    if not path.exists():
        raise FileNotFoundError(f"checkpoint {path} does not exist.")
    if path.is_dir():
        indexes = sorted(path.glob("*.index.json"))
        files = sorted(p for p in path.iterdir() if p.suffix in (".safetensors", *_TORCH_SUFFIXES))
        if len(indexes) == 1:
            path = indexes[0]
        elif len(indexes) > 1:
            raise ValueError(
                f"{path} holds several index files {[p.name for p in indexes]}; pass the one to load."
            )
        elif len(files) == 1:
            return files
        else:
            raise ValueError(
                f"{path} holds {'no' if not files else 'several'} checkpoint files ({[p.name for p in files]}) and no "
                f"*.index.json: pass a file, or a folder with one file or with a sharded checkpoint's index."
            )
    if path.suffix == ".json":
        index = json.loads(path.read_text())
        # A sharded checkpoint's index ({"weight_map": {tensor: file}}), or the map itself, as
        # Accelerate reads both.
        weight_map = index.get("weight_map", index) if isinstance(index, dict) else None
        if not isinstance(weight_map, dict) or not all(isinstance(f, str) for f in weight_map.values()):
            raise ValueError(
                f"{path} is not a checkpoint index: it needs a 'weight_map' (tensor name -> file), or to be that "
                f"map itself."
            )
        return [path.parent / name for name in dict.fromkeys(weight_map.values())]
    return [path]


def read_shard(path: Path) -> dict[str, Tensor]:
    """The tensors of one checkpoint file, on the CPU (torch files safely: ``weights_only=True``)."""
    if path.suffix == ".safetensors":
        with safe_open(str(path), framework="pt", device="cpu") as handle:
            return {name: handle.get_tensor(name) for name in handle.keys()}  # noqa: SIM118
    loaded = torch.load(path, map_location="cpu", weights_only=True)
    if isinstance(loaded, dict) and "state_dict" in loaded and isinstance(loaded["state_dict"], dict):
        loaded = loaded["state_dict"]  # a training checkpoint: its model weights
    if not isinstance(loaded, dict) or not all(isinstance(v, Tensor) for v in loaded.values()):
        raise ValueError(f"{path} does not hold a state dict (a mapping of names to tensors).")
    return loaded


def iter_checkpoint(checkpoint: str | os.PathLike[str]) -> Iterator[tuple[str, Tensor]]:
    """Every (name, tensor) of ``checkpoint``, one shard in memory at a time."""
    for shard in checkpoint_shards(checkpoint):
        yield from read_shard(shard).items()


class OffloadFolder:
    """Tensors kept on disk, one safetensors file each, listed in ``index.json``."""

    INDEX = "index.json"

    def __init__(self, folder: str | os.PathLike[str]) -> None:
        self.folder = Path(folder)
        index = self.folder / self.INDEX
        self.index: dict[str, str] = json.loads(index.read_text()) if index.exists() else {}

    def __contains__(self, name: str) -> bool:
        return name in self.index

    def save(self, name: str, tensor: Tensor) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        file = re.sub(r"[^\w.-]", "_", name) + ".safetensors"
        save_file({"tensor": tensor.detach().to("cpu").contiguous()}, str(self.folder / file))
        self.index[name] = file

    def flush(self) -> None:
        """Write the index (after the tensors, so a reader never sees a name without its file)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        temporary = self.folder / (self.INDEX + ".tmp")
        temporary.write_text(json.dumps(self.index, indent=1, sort_keys=True))
        os.replace(temporary, self.folder / self.INDEX)

    def load(self, name: str, device: torch.device | str = "cpu") -> Tensor:
        file = self.index.get(name)
        if file is None:
            raise KeyError(
                f"{name!r} was not offloaded to {self.folder} (its index lists {len(self.index)} tensors)."
            )
        with safe_open(str(self.folder / file), framework="pt", device=str(device)) as handle:
            return handle.get_tensor("tensor")


def offload_state_dict(save_dir: str | os.PathLike[str], state_dict: Mapping[str, Tensor]) -> None:
    """Write ``state_dict`` to the offload folder ``save_dir`` (Accelerate's function; drivetrain's folder format).

    ``dispatch_model(..., offload_dir=save_dir)`` and ``load_checkpoint_in_model`` read it: one
    safetensors file per tensor and an ``index.json`` naming them (Accelerate writes NumPy memory
    maps instead).
    """
    folder = OffloadFolder(save_dir)
    for name, tensor in state_dict.items():
        folder.save(name, tensor)
    folder.flush()
