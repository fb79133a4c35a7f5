"""precision="fp8": torchao float8 linear layers under bfloat16 autocast, and its refusals.

This machine has no float8 hardware: the refusals run for real here (CPU, and a CUDA GPU older
than compute capability 8.9 faked at torch's boundary), and so does the conversion of a model's
linear layers, which needs torchao but no GPU. Training in float8 runs on a GPU with float8 tensor
cores only (the ``cuda`` tests at the end).
"""

from __future__ import annotations

import sys
import warnings

import pytest
import torch
from torch import nn

import drivetrain as dt
from drivetrain.plugins.precision import Float8Precision, precision_from_name
from drivetrain.plugins.precision.fp8 import convert_linear_layers, float8_layer_names
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
    converted = convert_linear_layers(model, config=Float8LinearConfig.from_recipe_name("tensorwise"))
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
    assert convert_linear_layers(model) == []  # converting again changes nothing
    assert float8_layer_names(model) == ["2", "7"]


def test_module_filter_replaces_the_first_last_rule_but_not_the_size_rule() -> None:
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
    convert_linear_layers(model, config=config)
    layer = model[2]
    assert isinstance(layer, Float8Linear)
    assert layer.config.cast_config_weight.scaling_granularity.value == "axiswise"


def test_the_plugin_converts_in_place_and_warns_when_nothing_qualifies(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # An H100 faked at torch's boundary to build the plugin: only the conversion runs here, no float8 matmul.
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *args: (9, 0))
    precision = Float8Precision("rowwise")
    model = _mlp()
    assert precision.convert_module(model) is model
    assert precision.converted == ["2", "7"] and precision.recipe == "rowwise"
    assert precision.convert_module(model) is model and precision.converted == ["2", "7"]
    with pytest.warns(
        UserWarning, match=r"no linear layer of Sequential to train in float8.*module_filter_fn"
    ):
        precision.convert_module(nn.Sequential(nn.Linear(16, 16), nn.Linear(16, 16)))
    assert repr(precision) == "Float8Precision(recipe='rowwise', device='cuda')"


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
    for name, precision in (("bf16", "bf16-mixed"), ("fp8", Float8Precision(recipe))):
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
