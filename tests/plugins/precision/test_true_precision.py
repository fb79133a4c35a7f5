"""DoublePrecision and HalfPrecision: the whole model in one dtype."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from drivetrain.plugins.precision import DoublePrecision, HalfPrecision, Precision

PLUGINS = [
    pytest.param(DoublePrecision, torch.float64, id="64-true"),
    pytest.param(lambda: HalfPrecision("16-true"), torch.float16, id="16-true"),
    pytest.param(lambda: HalfPrecision("bf16-true"), torch.bfloat16, id="bf16-true"),
]


def _model() -> nn.Module:
    return nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 2))


@pytest.mark.parametrize(("make", "dtype"), PLUGINS)
def test_convert_module_casts_floating_parameters_and_buffers(make, dtype):
    model = make().convert_module(_model())
    assert {p.dtype for p in model.parameters()} == {dtype}
    batch_norm = model[1]
    assert batch_norm.running_mean.dtype == dtype
    assert batch_norm.num_batches_tracked.dtype == torch.long  # integer buffers are left alone


@pytest.mark.parametrize(("make", "dtype"), PLUGINS)
def test_module_init_and_forward_contexts_set_the_default_dtype(make, dtype):
    plugin = make()
    with plugin.module_init_context():
        layer = nn.Linear(3, 3)
    assert layer.weight.dtype == dtype
    with plugin.forward_context():
        assert torch.zeros(2).dtype == dtype
    assert torch.get_default_dtype() == torch.float32
    with pytest.raises(RuntimeError, match="boom"), plugin.forward_context():
        raise RuntimeError("boom")
    assert torch.get_default_dtype() == torch.float32


@pytest.mark.parametrize(("make", "dtype"), PLUGINS)
def test_inputs_and_outputs_are_converted(make, dtype):
    plugin = make()
    batch = {"x": torch.randn(5, 4), "ids": torch.arange(5), "extra": [torch.ones(2, dtype=torch.float64)]}
    converted = plugin.convert_input(batch)
    assert converted["x"].dtype == dtype
    assert converted["ids"].dtype == torch.long
    assert converted["extra"][0].dtype == dtype

    model = plugin.convert_module(_model()).train()
    with plugin.forward_context():
        output = model(converted["x"])
    assert output.dtype == dtype
    result = plugin.convert_output({"y": output, "step": torch.tensor(3)})
    assert result["y"].dtype == torch.float32
    assert result["step"].dtype == torch.long
    result["y"].sum().backward()  # the cast back to float32 keeps the graph
    assert model[0].weight.grad is not None and model[0].weight.grad.dtype == dtype


def test_convert_output_leaves_tensors_of_other_dtypes_alone():
    metric = torch.tensor([1.0], dtype=torch.float64)
    assert HalfPrecision("bf16-true").convert_output(metric).dtype == torch.float64


def test_changes_forward_only_for_non_default_precisions():
    assert not Precision().changes_forward
    assert DoublePrecision().changes_forward
    assert HalfPrecision("16-true").changes_forward


@pytest.mark.parametrize("value", ["16-mixed", "32-true", "fp16", 16, None])
def test_half_precision_rejects_other_names(value):
    with pytest.raises(ValueError, match="'16-true', 'bf16-true'"):
        HalfPrecision(value)


@pytest.mark.parametrize("make", [lambda: HalfPrecision("bf16-true"), DoublePrecision], ids=["bf16", "64"])
def test_training_in_a_true_precision_reduces_the_loss(make):
    plugin = make()
    torch.manual_seed(0)
    with plugin.module_init_context():
        model = nn.Linear(8, 1)
    target = nn.Linear(8, 1)
    inputs = torch.randn(64, 8)
    labels = target(inputs).detach()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for _ in range(30):
        with plugin.forward_context():
            prediction = model(plugin.convert_input(inputs))
        loss = nn.functional.mse_loss(plugin.convert_output(prediction), labels)
        plugin.pre_backward(loss, model).backward()
        plugin.optimizer_step(optimizer)
        optimizer.zero_grad()
        losses.append(loss.item())
    assert losses[-1] < 0.2 * losses[0]
    assert model.weight.dtype == plugin.dtype


@pytest.mark.parametrize(("make", "dtype"), PLUGINS)
def test_convert_module_leaves_complex_parameters_and_buffers_alone(make, dtype):
    model = nn.Linear(2, 2)
    model.register_buffer("filter", torch.tensor([1.0 + 2.0j, -3.0 - 0.5j]))
    model.phase = nn.Parameter(torch.tensor([0.25j], dtype=torch.complex128))
    converted = make().convert_module(model)
    assert converted is model  # in place
    assert model.weight.dtype == dtype
    assert model.filter.dtype == torch.complex64
    assert torch.equal(model.filter, torch.tensor([1.0 + 2.0j, -3.0 - 0.5j]))
    assert model.phase.dtype == torch.complex128 and model.phase.imag.item() == 0.25
