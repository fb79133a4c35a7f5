"""The big-model helpers as Accelerate's programs use them: maps planned for GPUs on a CPU host,
``fallback_allocation``, ``preload_module_classes``, ``offload_state_dict``, a flat checkpoint index,
``get_max_memory`` and ``clean_device_map``.

The expected device maps are the ones Accelerate 1.15's ``infer_auto_device_map`` gives for the
same models and budgets (its placement rule: fill GPUs, then the CPU, then disk, keeping room on
the main places for the largest layer still to place).
"""

from __future__ import annotations

import json
from collections import OrderedDict
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from drivetrain.big_modeling import (
    clean_device_map,
    dispatch_model,
    get_max_memory,
    infer_auto_device_map,
    init_empty_weights,
    load_checkpoint_and_dispatch,
    load_checkpoint_in_model,
)
from drivetrain.big_modeling import files as checkpoint_files


class ModelForTest(nn.Module):
    """Accelerate's test model: 64 + 72 + 100 bytes."""

    def __init__(self) -> None:
        super().__init__()
        self.linear1 = nn.Linear(3, 4)
        self.batchnorm = nn.BatchNorm1d(4)
        self.linear2 = nn.Linear(4, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear2(self.batchnorm(self.linear1(x)))


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.a = nn.Linear(width, width)
        self.b = nn.Linear(width, width)


class Deep(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([Block(8) for _ in range(3)])
        self.head = nn.Linear(8, 3)


def test_a_map_for_gpus_is_planned_on_a_host_without_them() -> None:
    model = ModelForTest()
    # Only linear1 fits on GPU 0 next to the room kept for the largest layer (linear2).
    assert infer_auto_device_map(model, max_memory={0: 200, 1: 200}) == {
        "linear1": 0,
        "batchnorm": 1,
        "linear2": 1,
    }
    assert infer_auto_device_map(model, max_memory={0: 250, 1: 400}) == {"": 0}
    # GPUs are filled by index whatever the order given; nothing fits GPU 0 beside the kept room.
    assert infer_auto_device_map(model, max_memory={1: 500, 0: 100}) == {"": 1}
    # The batch norm's buffers stay in memory off the GPU and no GPU has room left for them: a warning.
    with pytest.warns(UserWarning, match="hold 40 bytes of buffers.*offload_buffers=True"):
        assert infer_auto_device_map(model, max_memory={0: 200, "cpu": 200}) == {
            "linear1": 0,
            "batchnorm": "cpu",
            "linear2": "cpu",
        }
    assert (
        infer_auto_device_map(model, max_memory={0: 200, "cpu": 200}, offload_buffers=True)["batchnorm"]
        == "cpu"
    )
    # Disk is the last resort.
    with pytest.warns(UserWarning, match="hold 40 bytes of buffers"):
        assert infer_auto_device_map(model, max_memory={0: 10, "cpu": 200}) == OrderedDict(
            [("linear1", "cpu"), ("batchnorm", "disk"), ("linear2", "disk")]
        )


def test_fallback_allocation_puts_something_on_a_gpu_that_would_stay_empty() -> None:
    model = Deep()  # blocks: 3 x 576 bytes, head: 108 bytes
    assert infer_auto_device_map(model, max_memory={0: 400, "cpu": 5000}) == {"": "cpu"}
    assert infer_auto_device_map(model, max_memory={0: 400, "cpu": 5000}, fallback_allocation=True) == {
        "blocks": "cpu",
        "head": 0,
    }


class UsesWeightsDirectly(nn.Module):
    """A module that reads its child's weights without calling the child (why Accelerate has preload_module_classes)."""

    def __init__(self) -> None:
        super().__init__()
        self.dense = nn.Linear(4, 4)
        self.out = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(x @ self.dense.weight.T + self.dense.bias)


class Wrapper(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = UsesWeightsDirectly()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x)


def _saved(model: nn.Module, path: Path) -> Path:
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path))
    return path


def test_preload_module_classes_brings_in_the_weights_a_module_reads_directly(tmp_path: Path) -> None:
    torch.manual_seed(0)
    reference = Wrapper().eval()
    checkpoint = _saved(reference, tmp_path / "model.safetensors")
    inputs = torch.randn(3, 4)
    device_map = {"inner.dense": "disk", "inner.out": "cpu"}

    def load(preload: list[str] | None) -> nn.Module:
        with init_empty_weights():
            model = Wrapper()
        return load_checkpoint_and_dispatch(
            model,
            checkpoint,
            device_map=device_map,
            offload_folder=tmp_path / f"offload-{preload}",
            preload_module_classes=preload,
        ).eval()

    with torch.no_grad(), pytest.raises((RuntimeError, NotImplementedError), match="meta"):
        load(None)(inputs)  # dense is never called: its weights stay on disk
    model = load(["UsesWeightsDirectly"])
    with torch.no_grad():
        assert torch.equal(model(inputs), reference(inputs))
        assert torch.equal(model(inputs), reference(inputs))  # and again: they left and came back
    assert model.inner.dense.weight.device == torch.device("meta")


def test_offload_state_dict_parks_the_cpu_weights_on_disk_while_loading(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    torch.manual_seed(0)
    reference = ModelForTest().eval()
    checkpoint = _saved(reference, tmp_path / "model.safetensors")
    parked: list[str] = []
    save = checkpoint_files.OffloadFolder.save

    def watched(folder: checkpoint_files.OffloadFolder, name: str, tensor: torch.Tensor) -> None:
        parked.append(name)
        save(folder, name, tensor)

    monkeypatch.setattr(checkpoint_files.OffloadFolder, "save", watched)
    with init_empty_weights():
        model = ModelForTest()
    load_checkpoint_in_model(model, checkpoint, {"": "cpu"}, offload_state_dict=True)
    assert sorted(parked) == sorted(reference.state_dict())  # every CPU tensor went through disk
    for name, tensor in reference.state_dict().items():
        assert torch.equal(model.state_dict()[name], tensor), name


def test_a_flat_index_json_is_a_checkpoint_index(tmp_path: Path) -> None:
    torch.manual_seed(0)
    reference = ModelForTest().eval()
    state = {k: v.contiguous() for k, v in reference.state_dict().items()}
    first = {k: v for k, v in state.items() if k.startswith("linear")}
    save_file(first, str(tmp_path / "part-1.safetensors"))
    save_file({k: v for k, v in state.items() if k not in first}, str(tmp_path / "part-2.safetensors"))
    flat = {name: ("part-1.safetensors" if name in first else "part-2.safetensors") for name in state}
    (tmp_path / "weights.json").write_text(json.dumps(flat))
    with init_empty_weights():
        model = ModelForTest()
    load_checkpoint_in_model(model, tmp_path / "weights.json")
    dispatch_model(model, {"": "cpu"})
    for name, tensor in state.items():
        assert torch.equal(model.state_dict()[name], tensor), name
    (tmp_path / "bad.json").write_text(json.dumps({"linear1.weight": {"dtype": "float32"}}))
    with pytest.raises(ValueError, match="is not a checkpoint index"):
        load_checkpoint_in_model(model, tmp_path / "bad.json")


def test_get_max_memory_and_clean_device_map() -> None:
    assert list(get_max_memory({"cpu": "1KB", 1: 10, "disk": 5, 0: "2KiB"}).items()) == [
        (0, 2048),
        (1, 10),
        ("cpu", 1000),
        ("disk", 5),
    ]
    free = get_max_memory()
    assert "cpu" in free and "disk" not in free and free["cpu"] > 0
    with pytest.raises(ValueError, match="is not a place"):
        get_max_memory({"gpu-seven": 10})
    device_map = {"a.x": 0, "a.y": 0, "b.x": 1, "b.y": "cpu", "c": "disk"}
    assert clean_device_map(device_map) == {"b.x": 1, "b.y": "cpu", "c": "disk", "a": 0}
    assert clean_device_map({"a.x": 0, "a.y": 0}) == {"": 0}


@pytest.mark.parametrize("offload", ["disk", "cpu", "map"])
def test_save_model_of_an_offloaded_model_writes_its_weights(offload: str, tmp_path: Path) -> None:
    import drivetrain as dt
    from drivetrain.big_modeling import cpu_offload, disk_offload
    from drivetrain.big_modeling.files import read_shard

    torch.manual_seed(0)
    reference = ModelForTest().eval()
    model = ModelForTest().eval()
    model.load_state_dict(reference.state_dict())
    if offload == "disk":
        disk_offload(model, tmp_path / "offload")
    elif offload == "cpu":
        cpu_offload(model)
    else:
        checkpoint = _saved(reference, tmp_path / "model.safetensors")
        with init_empty_weights():
            model = ModelForTest()
        model = load_checkpoint_and_dispatch(
            model,
            checkpoint,
            device_map={"linear1": "cpu", "batchnorm": "disk", "linear2": "disk"},
            offload_folder=tmp_path / "offload",
        )
    assert model.linear2.weight.device == torch.device("meta")  # offloaded between calls
    accelerator = dt.Accelerator(cpu=True)
    accelerator.save_model(model, tmp_path / "saved")
    saved = read_shard(tmp_path / "saved" / "model.safetensors")
    assert saved.keys() == reference.state_dict().keys()
    for name, tensor in reference.state_dict().items():
        assert torch.equal(saved[name], tensor), name
