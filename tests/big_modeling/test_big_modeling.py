"""Big-model helpers: models built without memory, loaded to a device map of CPU and disk, run with offload.

Every dispatched model must compute exactly what the plain model computes (same CPU kernels).
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
    compute_module_sizes,
    cpu_offload,
    disk_offload,
    dispatch_model,
    infer_auto_device_map,
    init_empty_weights,
    init_on_device,
    load_checkpoint_and_dispatch,
    load_checkpoint_in_model,
    remove_hooks,
)

META = torch.device("meta")


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.up = nn.Linear(width, 2 * width)
        self.down = nn.Linear(2 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.relu(self.up(self.norm(x))))


class Net(nn.Module):
    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.embed = nn.Linear(8, width)
        self.blocks = nn.Sequential(Block(width), Block(width), Block(width))
        self.head = nn.Linear(width, 4)
        self.register_buffer("scale", torch.tensor(2.0))

    def forward(self, x: torch.Tensor, shift: torch.Tensor | None = None) -> torch.Tensor:
        out = self.head(self.blocks(self.embed(x))) * self.scale
        return out if shift is None else out + shift


@pytest.fixture
def reference() -> Net:
    torch.manual_seed(0)
    model = Net().eval()
    for parameter in model.parameters():  # LayerNorm starts at 1/0: make every tensor distinct
        nn.init.normal_(parameter)
    return model


@pytest.fixture
def inputs() -> torch.Tensor:
    return torch.randn(5, 8, generator=torch.Generator().manual_seed(1))


def _empty() -> Net:
    with init_empty_weights():
        return Net().eval()


def _save(model: nn.Module, path: Path) -> Path:
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path))
    return path


def _on_meta(module: nn.Module) -> bool:
    return all(t.device == META for t in [*module.parameters(), *module.buffers()])


def test_init_empty_weights_allocates_nothing_and_keeps_shapes() -> None:
    with init_empty_weights(include_buffers=True):
        huge = nn.Linear(200_000, 200_000)  # 160 GB in float32: this machine could not allocate it
    assert huge.weight.device == META and huge.weight.shape == (200_000, 200_000)
    with init_empty_weights():
        model = Net()
    assert all(p.device == META for p in model.parameters())
    assert model.scale.device.type == "cpu"  # buffers stay real unless asked
    with init_empty_weights(include_buffers=True):
        model = Net()
    assert _on_meta(model)
    assert nn.Module.register_parameter.__name__ == "register_parameter"  # the patch is gone again


def test_init_on_device_puts_parameters_there_and_keeps_their_kind() -> None:
    with init_on_device("meta"):
        layer = nn.Linear(3, 2)
        frozen = nn.Linear(3, 2).requires_grad_(False)
    assert isinstance(layer.weight, nn.Parameter) and layer.weight.device == META
    assert not frozen.weight.requires_grad


def test_a_device_map_of_cpu_and_disk_computes_what_the_plain_model_does(
    reference: Net, inputs: torch.Tensor, tmp_path: Path
) -> None:
    checkpoint = _save(reference, tmp_path / "model.safetensors")
    device_map = {
        "embed": "cpu",
        "blocks.0": "disk",
        "blocks.1": "cpu",
        "blocks.2": "disk",
        "head": "disk",
        "": "cpu",
    }
    model = load_checkpoint_and_dispatch(
        _empty(), checkpoint, device_map, offload_folder=tmp_path / "offload"
    )
    assert _on_meta(model.blocks[0]) and _on_meta(model.blocks[2]) and _on_meta(model.head)
    assert model.embed.weight.device.type == "cpu" and model.scale.device.type == "cpu"
    shift = torch.ones(4)
    with torch.no_grad():
        assert torch.equal(model(inputs), reference(inputs))
        assert torch.equal(model(inputs, shift=shift), reference(inputs, shift=shift))  # keyword inputs too
    assert _on_meta(model.blocks[0]) and _on_meta(model.head)  # weights leave again after each call
    assert model.hf_device_map == device_map
    offloaded = json.loads((tmp_path / "offload" / "index.json").read_text())
    assert set(offloaded) == {
        name for name in reference.state_dict() if name.startswith(("blocks.0.", "blocks.2.", "head."))
    }
    remove_hooks(model)
    assert not any(hasattr(m, "_hf_hook") or "forward" in vars(m) for m in model.modules())


def test_auto_device_map_fills_the_cpu_budget_then_disk(
    reference: Net, inputs: torch.Tensor, tmp_path: Path
) -> None:
    sizes = compute_module_sizes(reference)
    per_block = sizes["blocks.0"]
    # 16x16 ... by hand: a block holds LayerNorm 2*16, up 16*32+32, down 32*16+16 floats.
    assert per_block == 4 * (2 * 16 + 16 * 32 + 32 + 32 * 16 + 16)
    assert sizes[""] == 4 * sum(t.numel() for t in [*reference.parameters(), *reference.buffers()])
    # Room for the embedding and one block, plus the largest layer still to place (a block), which
    # the CPU keeps free so that a layer offloaded to disk can be brought in to run (as Accelerate).
    budget = sizes["embed"] + 2 * per_block + per_block // 2
    device_map = infer_auto_device_map(
        _empty(), max_memory={"cpu": budget, "disk": "1GB"}, no_split_module_classes=["Block"]
    )
    # The model's children in order, then its own buffer (Accelerate's order); Blocks stay whole.
    assert device_map == OrderedDict(
        [
            ("embed", "cpu"),
            ("blocks.0", "cpu"),
            ("blocks.1", "disk"),
            ("blocks.2", "disk"),
            ("head", "disk"),
            ("scale", "disk"),
        ]
    )
    model = load_checkpoint_and_dispatch(
        _empty(),
        _save(reference, tmp_path / "model.safetensors"),
        device_map="auto",
        max_memory={"cpu": budget, "disk": "1GB"},
        no_split_module_classes=["Block"],
        offload_folder=tmp_path / "offload",
    )
    with torch.no_grad():
        assert torch.equal(model(inputs), reference(inputs))


def test_modules_that_may_be_split_are_split_to_fill_the_first_place(reference: Net) -> None:
    sizes = compute_module_sizes(reference)
    # Plus room for the largest layer left to place (an up or down projection), kept free on the CPU.
    budget = sizes["embed"] + sizes["blocks.0.norm"] + 2 * sizes["blocks.0.up"]
    device_map = infer_auto_device_map(_empty(), max_memory={"cpu": budget, "disk": "1GB"})
    assert list(device_map.items())[:3] == [
        ("embed", "cpu"),
        ("blocks.0.norm", "cpu"),
        ("blocks.0.up", "cpu"),
    ]
    assert device_map["blocks.0.down"] == "disk" and device_map["blocks.1"] == "disk"


def test_sharded_and_torch_checkpoints_load_the_same(
    reference: Net, inputs: torch.Tensor, tmp_path: Path
) -> None:
    state = reference.state_dict()
    names = list(state)
    folder = tmp_path / "sharded"
    folder.mkdir()
    first, second = names[: len(names) // 2], names[len(names) // 2 :]
    save_file({n: state[n].contiguous() for n in first}, str(folder / "part-1.safetensors"))
    torch.save({n: state[n] for n in second}, folder / "part-2.bin")
    weight_map = {**{n: "part-1.safetensors" for n in first}, **{n: "part-2.bin" for n in second}}
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    for checkpoint in (folder, folder / "model.safetensors.index.json"):
        model = _empty()
        load_checkpoint_in_model(model, checkpoint, strict=True)
        with torch.no_grad():
            assert torch.equal(model(inputs), reference(inputs))


def test_dtype_converts_floating_point_weights(reference: Net, tmp_path: Path) -> None:
    model = _empty()
    load_checkpoint_in_model(model, _save(reference, tmp_path / "m.safetensors"), dtype=torch.float64)
    assert model.embed.weight.dtype == torch.float64
    assert torch.equal(model.embed.weight, reference.embed.weight.double())


def test_cpu_and_disk_offload_of_a_whole_model(reference: Net, inputs: torch.Tensor, tmp_path: Path) -> None:
    with torch.no_grad():
        expected = reference(inputs)
        for offloaded in (
            cpu_offload(_copy(reference)),
            disk_offload(_copy(reference), tmp_path / "offload"),
        ):
            assert _on_meta(offloaded)
            assert torch.equal(offloaded(inputs), expected)
            assert _on_meta(offloaded)


def _copy(model: Net) -> Net:
    copy = Net().eval()
    copy.load_state_dict(model.state_dict())
    return copy


def test_bad_device_maps_and_checkpoints_are_explained(reference: Net, tmp_path: Path) -> None:
    checkpoint = _save(reference, tmp_path / "m.safetensors")
    with pytest.raises(ValueError, match="names modules the model does not have: \\['decoder'\\]"):
        load_checkpoint_in_model(_empty(), checkpoint, {"decoder": "cpu", "": "cpu"})
    with pytest.raises(ValueError, match=r"leaves .* tensors without a place"):
        load_checkpoint_in_model(_empty(), checkpoint, {"embed": "cpu"})
    with pytest.raises(ValueError, match="needs offload_folder"):
        load_checkpoint_in_model(_empty(), checkpoint, {"": "disk"})
    with pytest.raises(ValueError, match="is not a place"):
        load_checkpoint_in_model(_empty(), checkpoint, {"": "gpu-seven"})
    with pytest.raises(ValueError, match="'even' is not supported; use 'auto'"):
        load_checkpoint_and_dispatch(_empty(), checkpoint, device_map="even")
    # Disk is the last resort, as in Accelerate: what fits nowhere else goes there.
    assert infer_auto_device_map(_empty(), max_memory={"cpu": 10}) == {"": "disk"}
    with pytest.raises(ValueError, match=r"max_memory\['cpu'\]='10 apples' is not a size"):
        infer_auto_device_map(_empty(), max_memory={"cpu": "10 apples"})
    other = Net(width=8)
    with pytest.raises(ValueError, match="has shape"):
        load_checkpoint_in_model(other, checkpoint)
    partial = tmp_path / "partial.safetensors"
    save_file({"head.weight": reference.head.weight.contiguous(), "extra": torch.zeros(1)}, str(partial))
    with pytest.raises(ValueError, match=r"missing .*unexpected \['extra'\]"):
        load_checkpoint_in_model(_empty(), partial, strict=True)
    with pytest.raises(ValueError, match="no data"):
        dispatch_model(_empty(), {"": "cpu"})
    with pytest.raises(FileNotFoundError):
        load_checkpoint_in_model(_empty(), tmp_path / "nothing.safetensors")


class TiedNet(nn.Module):
    """A language-model shape: the output layer shares the embedding's weight."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 6)
        self.mix = nn.Linear(6, 6)
        self.out = nn.Linear(6, 10, bias=False)
        self.out.weight = self.embed.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.out(self.mix(self.embed(ids)))


@pytest.mark.parametrize(
    "device_map",
    [
        None,
        {"": "cpu"},
        {"embed": "cpu", "mix": "disk", "out": "cpu"},
        {"embed": "disk", "mix": "cpu", "out": "disk"},
        {"embed": "cpu", "mix": "cpu", "out": "disk"},
    ],
)
def test_tied_weights_stay_tied(device_map: dict[str, str] | None, tmp_path: Path) -> None:
    torch.manual_seed(0)
    reference = TiedNet().eval()
    ids = torch.tensor([[1, 2, 3], [9, 0, 4]])
    # A saved tied model holds the shared tensor once (safetensors refuses shared storage).
    checkpoint = tmp_path / "tied.safetensors"
    save_file({k: v for k, v in reference.state_dict().items() if k != "out.weight"}, str(checkpoint))
    with init_empty_weights():
        model = TiedNet().eval()
    if device_map is None:
        load_checkpoint_in_model(model, checkpoint, strict=True)
        assert model.out.weight is model.embed.weight
    else:
        load_checkpoint_and_dispatch(
            model, checkpoint, device_map, offload_folder=tmp_path / "offload", strict=True
        )
    with torch.no_grad():
        assert torch.equal(model(ids), reference(ids))


def test_a_partial_checkpoint_is_reported(reference: Net, tmp_path: Path) -> None:
    partial = tmp_path / "partial.safetensors"
    save_file({"head.weight": reference.head.weight.contiguous(), "extra": torch.zeros(1)}, str(partial))
    model = _empty()
    with pytest.warns(UserWarning, match=r"missing \['blocks.0.*unexpected \['extra'\]; loaded what matches"):
        load_checkpoint_in_model(model, partial)
    assert torch.equal(model.head.weight, reference.head.weight)
