"""``Accelerator(dynamo_backend=...)`` / ``TorchDynamoPlugin``: ``prepare`` returns compiled models.

Compiled training must match uncompiled training; accumulation and ``no_sync`` keep working
through the compiled wrapper around DDP (2 processes); checkpoints and ``get_state_dict`` hold
the model's own parameter names. A backend of the test's own counts the graphs torch hands it,
so every test can tell that the compiled path really ran.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import drivetrain as dt
from drivetrain.utils import DynamoBackend, TorchDynamoPlugin, is_compiled_module, set_seed
from helpers.multiprocess import run_processes

# torch.compile imports torch.fx, whose import uses the deprecated torch.jit.script_method.
pytestmark = pytest.mark.filterwarnings(
    r"ignore:`torch\.jit\.script_method` is deprecated:DeprecationWarning"
)

COUNTING = "drivetrain_test_counting"
GRAPHS: list[int] = []  # one entry per graph the counting backend compiled (in this process)


def _register_counting_backend() -> None:
    import torch._dynamo

    if COUNTING in torch._dynamo.list_backends(exclude_tags=()):
        return

    @torch._dynamo.register_backend(name=COUNTING)  # type: ignore[misc]
    def counting(graph: torch.fx.GraphModule, example_inputs: list[torch.Tensor], **options: Any) -> Any:
        GRAPHS.append(len(graph.graph.nodes))
        return graph.forward  # run the captured graph as it is


@pytest.fixture(autouse=True)
def counting_backend() -> Iterator[None]:
    import torch._dynamo

    _register_counting_backend()
    GRAPHS.clear()
    torch._dynamo.reset()  # no graph compiled by an earlier test is reused
    yield


def _data(size: int = 32) -> TensorDataset:
    generator = torch.Generator().manual_seed(5)
    return TensorDataset(torch.randn(size, 6, generator=generator), torch.randn(size, 1, generator=generator))


class Net(nn.Module):
    """A model class of the user's own (torch compiles user code; it runs its own ``nn`` modules as they are)."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(6, 8), nn.Tanh())
        self.head = nn.Linear(8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


class Scale(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.weight


def _net() -> nn.Module:
    return Net()


def _train(accelerator: dt.Accelerator) -> tuple[nn.Module, Any]:
    """Two epochs of accumulated SGD; returns the prepared model and optimizer."""
    set_seed(0)
    model = _net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    loader = DataLoader(_data(), batch_size=4, shuffle=True)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    for _ in range(2):
        for x, y in loader:
            with accelerator.accumulate(model):
                accelerator.backward(nn.functional.mse_loss(model(x), y))
                optimizer.step()
                optimizer.zero_grad()
    return model, optimizer


def _weights(accelerator: dt.Accelerator, model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in accelerator.get_state_dict(model).items()}


def test_prepare_compiles_and_training_matches_the_uncompiled_run(tmp_path: Path) -> None:
    plain = dt.Accelerator(cpu=True, gradient_accumulation_steps=2)
    plain_model, _ = _train(plain)
    assert not is_compiled_module(plain_model) and not GRAPHS

    accelerator = dt.Accelerator(cpu=True, gradient_accumulation_steps=2, dynamo_backend=COUNTING)
    model, optimizer = _train(accelerator)
    assert is_compiled_module(model) and GRAPHS, "the prepared model runs through the backend"
    expected = _weights(plain, plain_model)
    weights = _weights(accelerator, model)
    assert list(weights) == [
        "body.0.weight",
        "body.0.bias",
        "head.weight",
        "head.bias",
    ]  # no "_orig_mod." prefix
    for name, value in expected.items():
        torch.testing.assert_close(weights[name], value, rtol=1e-5, atol=1e-6)

    # unwrap_model: keep_torch_compile=True (the default) keeps the compiled module, False strips it.
    inner = accelerator.unwrap_model(model, keep_torch_compile=False)
    assert type(inner) is Net
    assert accelerator.unwrap_model(model) is model and model._orig_mod is inner

    # Checkpoints hold the model's own names; they load into a compiled or an uncompiled run.
    accelerator.save_state(tmp_path / "state")
    accelerator.save_model(model, tmp_path / "export", safe_serialization=False)
    exported = torch.load(tmp_path / "export" / "pytorch_model.bin", weights_only=True)
    assert list(exported) == list(expected)
    fresh = dt.Accelerator(cpu=True)
    net = _net()
    fresh_model, _ = fresh.prepare(net, torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9))
    fresh.load_state(tmp_path / "state")
    for name, value in weights.items():
        assert torch.equal(fresh.get_state_dict(fresh_model)[name], value)
    again = dt.Accelerator(cpu=True, dynamo_backend="eager")
    net = _net()
    again_model, again_optimizer = again.prepare(net, torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9))
    again.load_state(tmp_path / "state")
    for name, value in weights.items():
        assert torch.equal(again.get_state_dict(again_model)[name], value)
    assert optimizer.state_dict()["state"].keys() == again_optimizer.state_dict()["state"].keys()


def test_bf16_autocast_runs_inside_the_compiled_model() -> None:
    eager = dt.Accelerator(cpu=True, mixed_precision="bf16")
    eager_model, _ = _train(eager)
    accelerator = dt.Accelerator(
        cpu=True, mixed_precision="bf16", dynamo_plugin=TorchDynamoPlugin(backend=COUNTING)
    )
    model, _ = _train(accelerator)
    assert GRAPHS
    assert model(torch.ones(2, 6)).dtype == torch.float32  # outputs in float32, as uncompiled
    expected = _weights(eager, eager_model)
    for name, value in _weights(accelerator, model).items():
        torch.testing.assert_close(value, expected[name], rtol=2e-2, atol=2e-2)


def test_settings_come_from_the_arguments_then_accelerates_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    default = dt.Accelerator(cpu=True)
    assert default.state.dynamo_plugin.backend is DynamoBackend.NO
    assert not is_compiled_module(default.prepare(_net()))

    monkeypatch.setenv("ACCELERATE_DYNAMO_BACKEND", "EAGER")
    monkeypatch.setenv("ACCELERATE_DYNAMO_MODE", "max-autotune")
    monkeypatch.setenv("ACCELERATE_DYNAMO_USE_FULLGRAPH", "true")
    from_environment = dt.Accelerator(cpu=True)  # read, so no "does not read" warning
    plugin = from_environment.state.dynamo_plugin
    assert (plugin.backend, plugin.mode, plugin.fullgraph, plugin.dynamic) == (
        DynamoBackend.EAGER,
        "max-autotune",
        True,
        None,
    )
    assert is_compiled_module(from_environment.prepare(_net()))

    # Explicit arguments win; fields left unset still come from the variables.
    off = dt.Accelerator(cpu=True, dynamo_backend="no")
    assert not is_compiled_module(off.prepare(_net()))
    partial = dt.Accelerator(cpu=True, dynamo_plugin=TorchDynamoPlugin(backend=COUNTING, fullgraph=False))
    assert (partial.dynamo_plugin.backend, partial.dynamo_plugin.mode, partial.dynamo_plugin.fullgraph) == (
        COUNTING,
        "max-autotune",
        False,
    )
    disabled = dt.Accelerator(cpu=True, dynamo_plugin=TorchDynamoPlugin(disable=True))
    assert not is_compiled_module(disabled.prepare(_net()))

    # A model the user compiled is not compiled again.
    mine = torch.compile(_net(), backend="eager")
    assert dt.Accelerator(cpu=True, dynamo_backend=COUNTING).prepare(mine) is mine


@pytest.mark.parametrize(
    ("arguments", "error", "message"),
    [
        (
            {"dynamo_backend": "eager", "dynamo_plugin": TorchDynamoPlugin()},
            ValueError,
            "Pass dynamo_backend or dynamo_plugin, not both",
        ),
        (
            {"dynamo_backend": "nonesuch"},
            ValueError,
            r"dynamo backend 'nonesuch' is not available .*inductor",
        ),
        ({"dynamo_backend": "tensorrt"}, ValueError, "dynamo backend 'tensorrt' is not available"),
        ({"dynamo_backend": 3}, TypeError, "dynamo_backend= takes a DynamoBackend or a backend name"),
        (
            {"dynamo_plugin": {"backend": "eager"}},
            TypeError,
            "dynamo_plugin= takes a drivetrain.utils.TorchDynamoPlugin",
        ),
        (
            {
                "dynamo_plugin": TorchDynamoPlugin(backend="eager", fullgraph=True),
                "strategy": "ddp",
                "devices": 2,
            },
            ValueError,
            r"fullgraph=True .* cannot compile DDPStrategy's wrapper",
        ),
        (
            {"dynamo_backend": "eager", "strategy": "deepspeed_stage_2"},
            ValueError,
            "with DeepSpeedStrategy is not supported",
        ),
    ],
)
def test_bad_settings_are_explained(arguments: dict[str, Any], error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        dt.Accelerator(cpu=True, **arguments)


def test_bad_plugin_fields_and_variables_are_explained(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match=r"mode='fast'\) is not a torch\.compile mode"):
        TorchDynamoPlugin(mode="fast")
    with pytest.raises(ValueError, match="takes a mode or options, not both"):
        TorchDynamoPlugin(mode="max-autotune", options={"trace.enabled": True})
    with pytest.raises(TypeError, match=r"fullgraph=\.\.\.\) takes True, False or None"):
        TorchDynamoPlugin(fullgraph="yes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"use_regional_compilation=True\) is not supported"):
        TorchDynamoPlugin(use_regional_compilation=True)
    monkeypatch.setenv("ACCELERATE_DYNAMO_MODE", "fast")
    with pytest.raises(ValueError, match=r"ACCELERATE_DYNAMO_MODE='fast' is not a torch\.compile mode"):
        dt.Accelerator(cpu=True)
    monkeypatch.delenv("ACCELERATE_DYNAMO_MODE")
    monkeypatch.setenv("ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION", "true")
    with pytest.warns(
        UserWarning,
        match="ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION='true': drivetrain.Accelerator does not read",
    ):
        dt.Accelerator(cpu=True)


@pytest.mark.timeout(600)
def test_inductor_compiles_and_trains_like_eager() -> None:
    eager = dt.Accelerator(cpu=True)
    eager_model, _ = _train(eager)
    accelerator = dt.Accelerator(cpu=True, dynamo_backend="inductor")
    model, _ = _train(accelerator)
    assert is_compiled_module(model)
    expected = _weights(eager, eager_model)
    for name, value in _weights(accelerator, model).items():
        torch.testing.assert_close(value, expected[name], rtol=1e-4, atol=1e-5)


# -- two processes: DDP inside the compiled wrapper ----------------------------------------------
def _rank(rank: int, world_size: int, directory: str) -> dict[str, Any]:
    _register_counting_backend()
    out: dict[str, Any] = {}
    accelerator = dt.Accelerator(cpu=True, gradient_accumulation_steps=2, dynamo_backend=COUNTING)
    set_seed(0)
    model = _net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(_data(), batch_size=4)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    out["wrapped"] = (is_compiled_module(model), type(model._orig_mod).__name__)
    flags, grads = [], []
    for x, y in loader:  # 4 batches per process
        with accelerator.accumulate(model):
            accelerator.backward(nn.functional.mse_loss(model(x), y))
            flags.append(accelerator.sync_gradients)
            grads.append(
                accelerator.unwrap_model(model, keep_torch_compile=False).body[0].weight.grad.clone()
            )
            optimizer.step()
            optimizer.zero_grad()
    out["flags"], out["grads"], out["graphs"] = flags, grads, len(GRAPHS)

    # no_sync and trigger_sync_in_backward on the compiled model.
    other = dt.Accelerator(cpu=True, dynamo_backend=COUNTING)
    probe = other.prepare(Scale())
    inputs = torch.tensor([float(rank + 1)])
    with other.no_sync(probe):
        probe(inputs).sum().backward()
    local = other.unwrap_model(probe, keep_torch_compile=False).weight.grad.item()
    probe.zero_grad()
    with other.no_sync(probe), other.trigger_sync_in_backward(probe):
        probe(inputs).sum().backward()
    out["probe"] = (local, other.unwrap_model(probe, keep_torch_compile=False).weight.grad.item())

    # unwrap_model keeps compilation around the user's module without changing the prepared model.
    view = accelerator.unwrap_model(model)
    out["view"] = (
        is_compiled_module(view),
        type(view._orig_mod).__name__,
        view is accelerator.unwrap_model(model),
        type(model._orig_mod).__name__,
    )
    out["state_dict"] = _weights(accelerator, model)
    accelerator.save_state(directory)
    resumed = dt.Accelerator(cpu=True, gradient_accumulation_steps=2, dynamo_backend="aot_eager")
    net = _net()
    resumed_model, _, _ = resumed.prepare(
        net, torch.optim.SGD(net.parameters(), lr=0.1), DataLoader(_data(), batch_size=4)
    )
    resumed.load_state(directory)
    out["resumed"] = _weights(resumed, resumed_model)

    # FSDP: torch.compile around the sharded module, accumulating through it, as without compiling.
    for name, backend in (("fsdp", "no"), ("fsdp_compiled", COUNTING)):
        sharded = dt.Accelerator(
            cpu=True, strategy="fsdp", gradient_accumulation_steps=2, dynamo_backend=backend
        )
        GRAPHS.clear()
        model, _ = _train(sharded)
        out[name] = (is_compiled_module(model), len(GRAPHS) > 0, _weights(sharded, model))
    return out


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    directory = tmp_path_factory.mktemp("compiled_state")
    return run_processes(_rank, 2, args=(str(directory),), timeout=240)


@pytest.mark.multiprocess
@pytest.mark.timeout(300)
def test_two_processes_accumulate_through_the_compiled_ddp_model(results: list[dict[str, Any]]) -> None:
    for out in results:
        assert out["wrapped"] == (True, "DistributedDataParallel")
        assert out["graphs"] >= 1
        assert out["flags"] == [False, True, False, True]
    for index, synced in enumerate(results[0]["flags"]):
        grads = [out["grads"][index] for out in results]
        if synced:
            assert torch.equal(grads[0], grads[1]), f"batch {index}: all-reduced gradients must agree"
        else:
            assert not torch.allclose(grads[0], grads[1]), f"batch {index}: gradients must stay local"
    # no_sync keeps each rank's gradient (1 and 2); trigger_sync_in_backward averages them.
    assert [out["probe"] for out in results] == [(1.0, 1.5), (2.0, 1.5)]


@pytest.mark.multiprocess
@pytest.mark.timeout(300)
def test_two_processes_save_and_load_the_models_own_names(results: list[dict[str, Any]]) -> None:
    for out in results:
        assert out["view"] == (True, "Net", True, "DistributedDataParallel")
        assert list(out["state_dict"]) == ["body.0.weight", "body.0.bias", "head.weight", "head.bias"]
        for name, value in out["state_dict"].items():
            assert torch.equal(out["resumed"][name], value)
    for name, value in results[0]["state_dict"].items():
        assert torch.equal(results[1]["state_dict"][name], value)


@pytest.mark.multiprocess
@pytest.mark.timeout(300)
def test_fsdp_trains_the_compiled_sharded_model_like_the_uncompiled_one(
    results: list[dict[str, Any]],
) -> None:
    plain, compiled = results[0]["fsdp"], results[0]["fsdp_compiled"]
    assert plain[:2] == (False, False) and compiled[:2] == (True, True)
    assert list(compiled[2]) == ["body.0.weight", "body.0.bias", "head.weight", "head.bias"]
    for name, value in plain[2].items():
        torch.testing.assert_close(compiled[2][name], value, rtol=1e-5, atol=1e-6)


@pytest.mark.multiprocess
@pytest.mark.timeout(300)
def test_two_compiled_processes_end_with_the_weights_of_one_process(results: list[dict[str, Any]]) -> None:
    accelerator = dt.Accelerator(cpu=True, gradient_accumulation_steps=2)
    set_seed(0)
    model = _net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(_data(), batch_size=8)  # one process, the two processes' batches together
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    for x, y in loader:
        with accelerator.accumulate(model):
            accelerator.backward(nn.functional.mse_loss(model(x), y))
            optimizer.step()
            optimizer.zero_grad()
    for name, value in _weights(accelerator, model).items():
        torch.testing.assert_close(results[0]["state_dict"][name], value, rtol=1e-5, atol=1e-6)
