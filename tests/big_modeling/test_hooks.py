"""Model hooks (``drivetrain.hooks``, Accelerate's ``accelerate.hooks``): around a module's forward, and the
device-aligning hook that big-model inference runs on."""

from __future__ import annotations

import copy
import inspect
from pathlib import Path

import pytest
import torch
from torch import nn

from drivetrain.big_modeling import dispatch_model, load_checkpoint_in_model
from drivetrain.hooks import (
    AlignDevicesHook,
    ModelHook,
    SequentialHook,
    add_hook_to_module,
    attach_align_device_hook,
    remove_hook_from_module,
    remove_hook_from_submodules,
)
from drivetrain.utils import align_module_device, get_state_dict_offloaded_model, has_offloaded_params

META = torch.device("meta")


class Small(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Linear(3, 4)
        self.norm = nn.BatchNorm1d(4)
        self.second = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor, shift: torch.Tensor | None = None) -> torch.Tensor:
        out = self.second(self.norm(self.first(x)))
        return out if shift is None else out + shift


class AddToInput(ModelHook):
    def pre_forward(
        self, module: nn.Module, *args: object, **kwargs: object
    ) -> tuple[tuple[object, ...], dict]:
        return (args[0] + 10,), kwargs


class Double(ModelHook):
    def post_forward(self, module: nn.Module, output: torch.Tensor) -> torch.Tensor:
        return output * 2


@pytest.fixture
def model() -> Small:
    torch.manual_seed(0)
    return Small().eval()


def test_a_hook_wraps_the_forward_and_leaves_its_name_and_signature(model: Small) -> None:
    x = torch.randn(5, 3)
    plain = model(x + 10)
    hook = AddToInput()
    assert add_hook_to_module(model, hook) is model
    assert model._hf_hook is hook and model._old_forward.__func__ is Small.forward
    assert model.forward.__name__ == "forward"
    assert list(inspect.signature(model.forward).parameters) == ["x", "shift"]
    assert torch.equal(model(x), plain)

    add_hook_to_module(model, AddToInput())  # replaces
    assert torch.equal(model(x), plain)
    add_hook_to_module(model, Double(), append=True)  # chains
    assert isinstance(model._hf_hook, SequentialHook) and len(model._hf_hook.hooks) == 2
    assert torch.equal(model(x), plain * 2)

    remove_hook_from_module(model)
    assert not hasattr(model, "_hf_hook") and not hasattr(model, "_old_forward")
    assert "forward" not in vars(model)  # the class's forward again
    assert torch.equal(model(x + 10), plain)


def test_no_grad_is_read_at_each_call(model: Small) -> None:
    hook = Double()
    add_hook_to_module(model, hook)
    assert model(torch.randn(2, 3)).requires_grad
    hook.no_grad = True
    assert not model(torch.randn(2, 3)).requires_grad


def test_a_copied_module_runs_its_own_hook(model: Small) -> None:
    add_hook_to_module(model, Double())
    twin = copy.deepcopy(model)
    with torch.no_grad():
        twin.second.bias.add_(1.0)
        x = torch.randn(2, 3)
        assert torch.allclose(twin(x), model(x) + 2)


def test_a_traced_graph_module_can_be_changed_after_its_hook_is_removed(model: Small) -> None:
    graph = torch.fx.symbolic_trace(model, concrete_args={"shift": None})
    x = torch.randn(2, 3)
    before = graph(x)
    add_hook_to_module(graph, ModelHook())
    remove_hook_from_module(graph, recurse=True)
    output = next(node for node in graph.graph.nodes if node.op == "output")
    with graph.graph.inserting_before(output):
        negated = graph.graph.call_function(torch.neg, (output.args[0],))
    output.args = (negated,)
    graph.recompile()
    assert torch.equal(graph(x), -before)


@pytest.mark.parametrize("offload_buffers", [False, True])
def test_offloading_keeps_the_weights_out_between_calls_and_puts_them_back(
    model: Small, offload_buffers: bool
) -> None:
    x = torch.randn(5, 3)
    expected = model(x)
    state = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    for layer in (model.first, model.norm, model.second):
        add_hook_to_module(layer, AlignDevicesHook("cpu", offload=True, offload_buffers=offload_buffers))
    assert all(p.device == META for p in model.parameters())
    assert (model.norm.running_mean.device == META) is offload_buffers
    assert has_offloaded_params(model.first) and not has_offloaded_params(model)
    assert torch.equal(model(x), expected)
    assert all(p.device == META for p in model.parameters())  # gone again after the call
    offloaded = get_state_dict_offloaded_model(model)  # read from where the hooks keep them
    assert offloaded.keys() == state.keys() and all(torch.equal(offloaded[k], v) for k, v in state.items())
    for layer in (model.first, model.norm, model.second):
        remove_hook_from_module(layer)
    assert all(torch.equal(model.state_dict()[name], value) for name, value in state.items())


def test_attach_align_device_hook_with_a_weights_map_and_preloaded_blocks(model: Small) -> None:
    x = torch.randn(5, 3)
    expected = model(x)
    weights = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    attach_align_device_hook(model, execution_device="cpu", offload=True, weights_map=weights)
    assert isinstance(model.first._hf_hook, AlignDevicesHook) and not hasattr(
        model, "_hf_hook"
    )  # no tensors of its own
    assert torch.equal(model(x), expected)
    remove_hook_from_submodules(model)
    assert torch.equal(model.first.weight, weights["first.weight"])

    # A module that reads its submodules' weights without calling them: preloaded as a whole.
    attach_align_device_hook(model, execution_device="cpu", offload=True, preload_module_classes=["Small"])
    assert isinstance(model._hf_hook, AlignDevicesHook) and not hasattr(model.first, "_hf_hook")
    with align_module_device(model):
        assert torch.equal(model.first.weight, weights["first.weight"])
    assert model.first.weight.device == META
    remove_hook_from_submodules(model)


def test_inputs_go_to_the_execution_device_but_skip_keys() -> None:
    seen: dict[str, torch.device] = {}

    class Probe(nn.Module):
        def forward(self, x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
            seen["x"], seen["keep"] = x.device, keep.device
            return keep

    probe = Probe()
    add_hook_to_module(probe, AlignDevicesHook(execution_device=META, skip_keys="keep"))
    probe(torch.ones(2), keep=torch.ones(2))
    assert seen == {"x": META, "keep": torch.device("cpu")}


def test_dispatched_models_carry_accelerates_hooks(model: Small, tmp_path: Path) -> None:
    x = torch.randn(5, 3)
    expected = model(x)
    torch.save(model.state_dict(), tmp_path / "weights.pt")
    load_checkpoint_in_model(
        model,
        tmp_path / "weights.pt",
        {"first": "cpu", "norm": "disk", "second": "cpu"},
        tmp_path / "offload",
    )
    dispatch_model(model, {"first": "cpu", "norm": "disk", "second": "cpu"}, offload_dir=tmp_path / "offload")
    assert isinstance(
        model.norm._hf_hook, AlignDevicesHook
    ) and model.norm._hf_hook.execution_device == torch.device("cpu")
    assert model.norm.weight.device == META and has_offloaded_params(model.norm)
    with align_module_device(model.norm):
        assert model.norm.weight.device.type == "cpu"
    assert torch.equal(model(x), expected)


def test_bad_hooks_are_explained(model: Small) -> None:
    with pytest.raises(TypeError, match="expects a ModelHook"):
        add_hook_to_module(model, lambda module: module)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"offload=True\) needs an execution_device"):
        AlignDevicesHook(offload=True)
    with pytest.raises(ValueError, match="tied_params_map"):
        AlignDevicesHook("cpu", tied_params_map={})


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_offloaded_to_the_cpu_running_on_the_gpu(model: Small) -> None:
    x = torch.randn(5, 3)
    expected = model(x)
    attach_align_device_hook(model, execution_device=0, offload=True)
    add_hook_to_module(model, AlignDevicesHook(io_same_device=True), append=True)
    assert model.norm.running_mean.device == torch.device("cuda", 0)  # buffers stay, on the GPU
    out = model(x)
    assert out.device.type == "cpu" and torch.allclose(out, expected, atol=1e-5)
    remove_hook_from_submodules(model)
    assert model.first.weight.device.type == "cpu" and model.norm.running_mean.device.type == "cpu"
