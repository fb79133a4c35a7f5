"""precision="fp8": torchao float8 linear layers, compiled, under bfloat16 autocast, and its refusals.

This machine has no float8 hardware: the refusals run for real here (CPU, and a CUDA GPU older
than compute capability 8.9 faked at torch's boundary), and so do the choice of layers, their
conversion and the compile wrapping, which need torchao but no GPU (torch's float8 matmul has a
CPU kernel, so a converted layer even runs here, compiled with the ``eager`` backend). Training in
float8 runs on a GPU with float8 tensor cores only (the ``cuda`` tests at the end).
"""

from __future__ import annotations

import logging
import sys
import warnings

import pytest
import torch
from torch import nn

import drivetrain as dt
from drivetrain.plugins.precision import Float8Precision, precision_from_name
from drivetrain.plugins.precision.fp8 import convert_linear_layers, float8_layer_names
from drivetrain.plugins.precision.fp8_compile import is_compiled
from drivetrain.plugins.precision.fp8_layers import TOO_SMALL, plan_layers, too_small_to_gain
from drivetrain.utils import AORecipeKwargs, AutocastKwargs

torchao = pytest.importorskip("torchao")
from torchao.float8 import Float8LinearConfig  # noqa: E402
from torchao.float8.float8_linear import Float8Linear  # noqa: E402

_NO_FP8 = r"'bf16-mixed' here instead, or run on a GPU with float8 support: compute capability 8\.9 or newer"


def _mlp() -> nn.Module:
    return nn.Sequential(
        nn.Linear(32, 64),  # first: kept
        nn.ReLU(),
        nn.Linear(64, 64),  # converted
        nn.ReLU(),
        nn.Linear(64, 20),  # 20 is not a multiple of 16: kept
        nn.ReLU(),
        nn.Linear(20, 16),  # 20 again: kept
        nn.Linear(16, 16),  # converted
        nn.Linear(16, 48),  # last: kept
    )


# -- refusals --------------------------------------------------------------------------------
def test_fp8_on_cpu_is_an_error_at_construction_in_both_doors() -> None:
    with pytest.raises(ValueError, match=r"'cpu' hardware, which has none.*" + _NO_FP8):
        dt.Trainer(accelerator="cpu", precision="fp8")
    with pytest.raises(ValueError, match=r"'cpu' hardware.*" + _NO_FP8):
        dt.Accelerator(cpu=True, mixed_precision="fp8")
    with pytest.raises(ValueError, match=_NO_FP8):
        dt.Accelerator(cpu=True, mixed_precision="fp8", kwargs_handlers=[AORecipeKwargs()])


def test_a_gpu_older_than_ada_is_refused_with_its_name_and_capability(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *args: (8, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *args: "NVIDIA A100-SXM4-80GB")
    with pytest.raises(ValueError, match=r"A100-SXM4-80GB, compute capability 8\.0\) lacks.*" + _NO_FP8):
        Float8Precision(device="cuda")
    with pytest.raises(ValueError, match=r"compute capability 8\.0"):
        precision_from_name("fp8", "cuda")


def test_cuda_without_a_gpu_is_refused(hardware: object) -> None:
    with pytest.raises(ValueError, match=r"needs a CUDA GPU, but none is available"):
        Float8Precision(device="cuda")


def test_bad_options_are_errors_before_the_hardware_is_asked() -> None:
    with pytest.raises(ValueError, match=r"recipe='columnwise'.*'tensorwise', 'rowwise'"):
        Float8Precision("columnwise", device="cpu")
    with pytest.raises(ValueError, match="both recipe= and config="):
        Float8Precision("rowwise", config=Float8LinearConfig(), device="cpu")
    with pytest.raises(TypeError, match="module_filter_fn must be a function"):
        Float8Precision(module_filter_fn="head", device="cpu")  # type: ignore[arg-type]


def test_missing_torchao_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torchao.float8", None)  # what an uninstalled package looks like
    with pytest.raises(ModuleNotFoundError, match=r"pip install 'drivetrain\[fp8\]'"):
        convert_linear_layers(_mlp())


def test_accelerate_spelling_is_accepted_and_reported_as_fp8() -> None:
    with pytest.raises(ValueError) as excinfo:
        dt.Accelerator(cpu=True, mixed_precision="bf8")
    assert "'fp8'" in str(excinfo.value)


def test_recipe_options_with_another_precision_warn_that_they_do_nothing() -> None:
    handler = AORecipeKwargs(module_filter_func=lambda module, fqn: True)
    with pytest.warns(UserWarning, match="module_filter_fn=.*has no effect: precision 'bf16-mixed'"):
        dt.Accelerator(cpu=True, mixed_precision="bf16", kwargs_handlers=[handler])


def test_recipe_kwargs_keep_the_torchao_config_object() -> None:
    config = Float8LinearConfig.from_recipe_name("rowwise")
    assert AORecipeKwargs(config=config).to_kwargs() == {"config": config}
    assert AORecipeKwargs().to_kwargs() == {}


# -- converting a model (torchao, no GPU needed) -------------------------------------------------
def test_default_filter_skips_first_last_and_sizes_not_divisible_by_16() -> None:
    model = _mlp()
    weights = [p for p in model.parameters()]
    converted = convert_linear_layers(
        model, config=Float8LinearConfig.from_recipe_name("tensorwise"), skip_small=False
    )
    assert converted == ["2", "7"]
    assert [type(m).__name__ for m in model if isinstance(m, nn.Linear)] == [
        "Linear",
        "Float8Linear",
        "Linear",
        "Linear",
        "Float8Linear",
        "Linear",
    ]
    # Same parameters (an optimizer built before conversion keeps working), same state-dict keys.
    assert all(a is b for a, b in zip(weights, model.parameters(), strict=True))
    assert list(model.state_dict()) == list(_mlp().state_dict())
    assert convert_linear_layers(model, skip_small=False) == []  # converting again changes nothing
    assert float8_layer_names(model) == ["2", "7"]


def test_layers_too_small_to_gain_stay_in_bf16_by_torchaos_size_guidance() -> None:
    # torchao's H100 measurements: tensorwise pays from out_features > 1024 or in_features > 4096;
    # rowwise only from out_features > 2048 and in_features > 1024 (and not both <= 4096 / 2048).
    assert too_small_to_gain(1024, 4096, "tensorwise") and not too_small_to_gain(1040, 64, "tensorwise")
    assert not too_small_to_gain(16, 4112, "tensorwise")
    assert too_small_to_gain(4096, 2048, "rowwise") and not too_small_to_gain(2064, 2064, "rowwise")
    assert too_small_to_gain(8192, 1024, "rowwise") and too_small_to_gain(2048, 8192, "rowwise")
    model = nn.Sequential(
        nn.Linear(64, 64),  # first
        nn.Linear(64, 1024),  # small for both recipes
        nn.Linear(1024, 1040),  # pays with tensorwise scaling only
        nn.Linear(1040, 2064),  # pays with tensorwise scaling only (in_features 1040 <= 2048)
        nn.Linear(2064, 2064),  # pays with both
        nn.Linear(2064, 16),  # last
    )
    tensorwise = plan_layers(model, granularity="tensorwise")
    assert tensorwise.float8 == ["2", "3", "4"] and tensorwise.kept_for(TOO_SMALL) == ["1"]
    assert plan_layers(model, granularity="rowwise").float8 == ["4"]
    assert plan_layers(model, granularity="tensorwise", skip_small=False).float8 == ["1", "2", "3", "4"]
    # A filter of one's own decides alone (but sizes must still be multiples of 16).
    assert plan_layers(model, granularity="rowwise", module_filter_fn=lambda m, fqn: fqn in "01").float8 == [
        "0",
        "1",
    ]


def test_module_filter_replaces_the_first_last_and_small_rules_but_not_the_multiple_of_16() -> None:
    model = _mlp()
    converted = convert_linear_layers(model, module_filter_fn=lambda module, fqn: fqn != "2")
    assert converted == ["0", "7", "8"]  # "4" and "6" have a size of 20


def test_a_lone_linear_layer_is_left_alone() -> None:
    layer = nn.Linear(32, 32)
    assert convert_linear_layers(layer, module_filter_fn=lambda module, fqn: True) == []
    assert type(layer) is nn.Linear


def test_recipe_reaches_the_converted_layers() -> None:
    model = _mlp()
    config = Float8LinearConfig.from_recipe_name("rowwise")
    convert_linear_layers(model, config=config, skip_small=False)
    layer = model[2]
    assert isinstance(layer, Float8Linear)
    assert layer.config.cast_config_weight.scaling_granularity.value == "axiswise"


@pytest.fixture
def h100(monkeypatch: pytest.MonkeyPatch) -> None:
    """An H100 faked at torch's boundary, to build the plugin: only conversion and compile wrapping run here."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *args: (9, 0))


class _Wide(nn.Module):
    """Two blocks whose MLP layers are large enough to gain from tensorwise float8 (out_features 1040)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(32, 64)
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(64, 1040), nn.Linear(1040, 64)) for _ in range(2))
        self.head = nn.Linear(64, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x)
        for block in self.blocks:
            x = x + block(x)
        return self.head(x)


class _Module(nn.Module):
    """What a TrainingModule looks like to the precision: the network under an attribute."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = _Wide()


def test_the_plugin_converts_and_compiles_the_model_in_place_and_says_what_it_kept(
    h100: None, caplog: pytest.LogCaptureFixture
) -> None:
    precision = Float8Precision()
    assert precision.recipe == "tensorwise" and precision.compile == "model"
    module = _Module()
    keys = list(module.state_dict())
    with caplog.at_level(logging.INFO, logger="drivetrain"):
        assert precision.convert_module(module) is module
    assert precision.converted == ["net.blocks.0.0", "net.blocks.1.0"]
    assert precision.kept == {
        "net.embed": "first or last linear layer",
        "net.blocks.0.1": TOO_SMALL,
        "net.blocks.1.1": TOO_SMALL,
        "net.head": "first or last linear layer",
    }
    # The smallest module holding every float8 layer with a forward of its own: the network (the
    # ModuleList between them has none), compiled in place: same object, same state-dict keys.
    assert precision.compiled == ["net"]
    assert is_compiled(module.net) and not is_compiled(module) and not is_compiled(module.net.blocks[0][0])
    assert list(module.state_dict()) == keys
    message = caplog.text
    assert "2 linear layer(s) train in float8 (tensorwise scaling, compiled: 'net')" in message
    assert "2 too small to gain (net.blocks.0.1, net.blocks.1.1) by torchao's size guidance" in message
    assert "in_features <= 4096 and out_features <= 1024; skip_small_layers=False converts them" in message
    # Sharding strategies convert a second time before they shard: nothing changes, nothing is said.
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="drivetrain"):
        precision.convert_module(module)
    assert precision.converted == ["net.blocks.0.0", "net.blocks.1.0"] and caplog.text == ""
    assert repr(precision) == "Float8Precision(recipe='tensorwise', compile='model', device='cuda')"


def test_compile_layers_compiles_each_float8_layer(h100: None) -> None:
    precision = Float8Precision("rowwise", compile="layers", skip_small_layers=False)
    module = _Module()
    precision.convert_module(module)
    assert precision.converted == ["net.blocks.0.0", "net.blocks.0.1", "net.blocks.1.0", "net.blocks.1.1"]
    assert precision.compiled == precision.converted
    assert all(is_compiled(module.get_submodule(name)) for name in precision.converted)
    assert not is_compiled(module.net)


def test_compile_layers_warns_when_dynamo_would_keep_too_few_shapes(h100: None) -> None:
    # Dynamo keeps one compiled graph per shape for every layer, up to its recompile limit (8).
    layers = [nn.Linear(64, 1040 + 16 * index) for index in range(9)]
    model = nn.Sequential(nn.Linear(8, 64), nn.ModuleList(layers), nn.Linear(64, 8))
    with pytest.warns(UserWarning, match=r"9 different shapes.*at most 8.*compile='model'"):
        Float8Precision(compile="layers").convert_module(model)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Float8Precision().convert_module(
            nn.Sequential(nn.Linear(8, 64), nn.ModuleList(layers[:3]), nn.Linear(64, 8))
        )


def test_layers_inside_a_module_the_user_compiled_are_left_to_it(
    h100: None, caplog: pytest.LogCaptureFixture
) -> None:
    module = _Module()
    module.net.compile(backend="eager")
    precision = Float8Precision()
    with caplog.at_level(logging.INFO, logger="drivetrain"):
        precision.convert_module(module)
    assert precision.compiled == []
    assert not any(is_compiled(module.get_submodule(name)) for name in precision.converted)
    assert "(tensorwise scaling, inside a module you compiled)" in caplog.text


def test_a_float8_layer_run_outside_the_compiled_model_compiles_itself(
    h100: None, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # A step that calls the layers directly never runs the compiled model's forward: each layer
    # compiles on its first eager call instead (the eager backend: this runs on the CPU).
    precision = Float8Precision(skip_small_layers=False, compile_options={"backend": "eager"})
    module = _Module()
    precision.convert_module(module)
    monkeypatch.undo()  # the CPU again, to run the layers
    layer = module.net.blocks[0][0]
    assert precision.compiled == ["net"] and not is_compiled(layer)
    module.net(torch.randn(4, 32))  # the compiled model: its layers stay as they are
    assert not is_compiled(layer)
    with caplog.at_level(logging.INFO, logger="drivetrain"):
        layer(torch.randn(4, 64)).sum().backward()
        module.net.blocks[1][0](torch.randn(4, 64))
    assert is_compiled(layer) and is_compiled(module.net.blocks[1][0])
    assert caplog.text.count("ran outside the compiled model") == 1
    assert layer(torch.randn(4, 64)).shape == (4, 1040)


def test_opting_out_of_compile_warns_once_with_the_measured_cost(h100: None) -> None:
    with pytest.warns(
        UserWarning,
        match=r"compile=False\) runs the float8 layers eagerly: eager float8 was measured 3\.5x slower",
    ):
        precision = Float8Precision(compile=False)
    module = _Module()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        precision.convert_module(module)
        precision.convert_module(module)
    assert precision.converted and precision.compiled == [] and not is_compiled(module.net)
    with pytest.raises(ValueError, match=r"compile='graph'.*'model'.*'layers'.*False"):
        Float8Precision(compile="graph")
    with pytest.raises(TypeError, match="compile_options"):
        Float8Precision(compile_options="max-autotune")  # type: ignore[arg-type]


def test_the_plugin_warns_when_nothing_qualifies(h100: None) -> None:
    precision = Float8Precision("rowwise")
    model = _mlp()
    with pytest.warns(
        UserWarning, match=r"no linear layer of Sequential to train in float8.*too small to gain"
    ):
        assert precision.convert_module(model) is model
    assert precision.converted == []
    with pytest.warns(UserWarning, match=r"no linear layer of Sequential.*module_filter_fn"):
        precision.convert_module(nn.Sequential(nn.Linear(16, 16), nn.Linear(16, 16)))


# -- training on a GPU with float8 tensor cores ----------------------------------------------------
def _has_float8_gpu() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() >= (8, 9)


class _Block(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.fc, self.out = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        batch, length, width = hidden.shape
        q, k, v = self.qkv(self.norm1(hidden)).view(batch, length, 3, self.heads, -1).unbind(2)
        attended = nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
        )
        hidden = hidden + self.proj(attended.transpose(1, 2).reshape(batch, length, width))
        return hidden + self.out(nn.functional.gelu(self.fc(self.norm2(hidden))))


class _TinyGPT(nn.Module):
    """A 2-block decoder; every linear size is a multiple of 16."""

    def __init__(self, vocabulary: int = 512, width: int = 256, heads: int = 4, context: int = 64) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocabulary, width)
        self.position = nn.Parameter(torch.zeros(context, width))
        self.blocks = nn.Sequential(_Block(width, heads), _Block(width, heads))
        self.head = nn.Linear(width, vocabulary)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.embed(tokens) + self.position[: tokens.shape[1]]))


class _LanguageModel(dt.TrainingModule):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = _TinyGPT()
        self.losses: list[float] = []

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        logits = self.net(batch[:, :-1])
        loss = nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))
        self.losses.append(loss.item())
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=3e-3)


def _tokens() -> torch.Tensor:
    # Learnable sequences: each token is the previous one plus a per-sequence stride, modulo 512.
    generator = torch.Generator().manual_seed(1)
    start = torch.randint(0, 512, (512, 1), generator=generator)
    stride = torch.randint(1, 8, (512, 1), generator=generator)
    return (start + stride * torch.arange(65)) % 512


#: float8 rounding changes every step a little; after 60 steps the mean loss of the last 10 must be
#: within 10 % of bf16's (both start at ln 512 ≈ 6.2 and fall well below it).
FP8_LOSS_REL_TOL = 0.1


@pytest.mark.cuda
@pytest.mark.skipif(not _has_float8_gpu(), reason="needs a CUDA GPU with float8 (compute capability 8.9+)")
@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_fp8_training_tracks_bf16_on_a_gpt(recipe: str) -> None:
    losses = {}
    if recipe == "tensorwise":  # the default: the model compiled
        fp8 = Float8Precision(recipe, skip_small_layers=False)
    else:  # and eager float8, which warns what it costs
        with pytest.warns(UserWarning, match="runs the float8 layers eagerly"):
            fp8 = Float8Precision(recipe, skip_small_layers=False, compile=False)
    for name, precision in (("bf16", "bf16-mixed"), ("fp8", fp8)):
        module = _LanguageModel()
        trainer = dt.Trainer(
            accelerator="cuda",
            devices=1,
            precision=precision,
            max_steps=60,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
        )
        loader = torch.utils.data.DataLoader(_tokens(), batch_size=16, shuffle=True)
        trainer.fit(module, loader)
        if name == "fp8":
            # 2 blocks x (qkv, proj, fc, out), less the first (blocks.0.qkv); the head is the last.
            assert len(float8_layer_names(module.net)) == 7
        losses[name] = sum(module.losses[-10:]) / 10
    assert losses["bf16"] < 5.0, losses  # it learned (ln 512 ≈ 6.24)
    assert abs(losses["fp8"] - losses["bf16"]) <= FP8_LOSS_REL_TOL * losses["bf16"], losses


@pytest.mark.cuda
@pytest.mark.skipif(not _has_float8_gpu(), reason="needs a CUDA GPU with float8 (compute capability 8.9+)")
def test_fp8_through_the_accelerator_converts_and_trains() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        accelerator = dt.Accelerator(
            mixed_precision="fp8",
            kwargs_handlers=[AORecipeKwargs(module_filter_func=lambda module, fqn: fqn.endswith(".fc"))],
        )
    torch.manual_seed(0)
    net = _TinyGPT()
    optimizer = torch.optim.AdamW(net.parameters(), lr=3e-3)
    net, optimizer = accelerator.prepare(net, optimizer)
    assert accelerator.mixed_precision == "fp8"
    assert float8_layer_names(accelerator.unwrap_model(net)) == ["blocks.0.fc", "blocks.1.fc"]
    batch = _tokens()[:16].to(accelerator.device)
    first = None
    with accelerator.autocast(AutocastKwargs(cache_enabled=False)):  # fp8 autocasts: no "no effect" warning
        assert net(batch[:, :-1]).dtype == torch.float32
    for _ in range(20):
        logits = net(batch[:, :-1])
        loss = nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        first = loss.item() if first is None else first
    assert loss.item() < first
