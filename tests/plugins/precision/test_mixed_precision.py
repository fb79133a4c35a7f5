"""MixedPrecision: autocast, float16 loss scaling with skipped steps, and its validation."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from drivetrain.plugins.precision import MixedPrecision


def _regression(seed: int = 0) -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
    inputs = torch.randn(64, 8)
    labels = (inputs @ torch.randn(8, 1)).tanh()
    return model, inputs, labels


def _backward(
    plugin: MixedPrecision, model: nn.Module, inputs: torch.Tensor, labels: torch.Tensor
) -> torch.Tensor:
    with plugin.forward_context():
        prediction = model(inputs)
    loss = nn.functional.mse_loss(plugin.convert_output(prediction), labels)
    plugin.pre_backward(loss, model).backward()
    return loss


# -- validation --------------------------------------------------------------------------------
@pytest.mark.parametrize("precision", ["32-true", "fp16", "16-true", "bf16", 16])
def test_unknown_precision_is_rejected(precision):
    with pytest.raises(ValueError, match="'16-mixed', 'bf16-mixed'"):
        MixedPrecision(precision, device="cpu")


def test_unknown_device_is_rejected():
    with pytest.raises(ValueError, match="not a device torch knows"):
        MixedPrecision("bf16-mixed", device="warp-drive")


def test_device_without_autocast_is_rejected(monkeypatch):
    monkeypatch.setattr(torch.amp.autocast_mode, "is_autocast_available", lambda device_type: False)
    with pytest.raises(ValueError, match=r"does not offer for device type 'cpu'.*'bf16-true'"):
        MixedPrecision("bf16-mixed", device="cpu")


def test_device_type_torch_has_no_autocast_for_is_rejected():
    with pytest.raises(ValueError, match="device type 'meta'"):
        MixedPrecision("16-mixed", device="meta")


def test_bf16_on_a_cuda_gpu_without_bf16_is_rejected(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *args, **kwargs: False)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *args: "Tesla V100")
    with pytest.raises(ValueError, match=r"Tesla V100.*precision='16-mixed'"):
        MixedPrecision("bf16-mixed", device="cuda")


def test_bf16_check_is_skipped_on_other_devices(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *args, **kwargs: False)
    assert MixedPrecision("bf16-mixed", device="cpu").dtype == torch.bfloat16


def test_scaler_with_bf16_is_rejected():
    with pytest.raises(ValueError, match="only '16-mixed' scales the loss"):
        MixedPrecision("bf16-mixed", device="cpu", scaler=torch.amp.GradScaler("cpu"))


def test_scaler_of_the_wrong_type_or_device_is_rejected():
    with pytest.raises(TypeError, match=r"expects a torch\.amp\.GradScaler"):
        MixedPrecision("16-mixed", device="cpu", scaler=object())
    with pytest.raises(ValueError, match="built for device type 'cuda'"):
        MixedPrecision("16-mixed", device="cpu", scaler=torch.amp.GradScaler("cuda", enabled=False))


def test_device_index_and_torch_device_are_reduced_to_the_type():
    assert MixedPrecision("bf16-mixed", device=torch.device("cpu")).device == "cpu"
    assert MixedPrecision("bf16-mixed", device="cpu:0").device == "cpu"


# -- forward ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("precision", "dtype"), [("16-mixed", torch.float16), ("bf16-mixed", torch.bfloat16)]
)
def test_forward_context_really_autocasts(precision, dtype):
    plugin = MixedPrecision(precision, device="cpu")
    a, b = torch.randn(4, 4), torch.randn(4, 4)
    with plugin.forward_context():
        assert (a @ b).dtype == dtype
    assert (a @ b).dtype == torch.float32
    assert plugin.changes_forward


def test_convert_output_returns_float32_and_keeps_other_dtypes():
    plugin = MixedPrecision("bf16-mixed", device="cpu")
    out = plugin.convert_output(
        {
            "logits": torch.ones(2, dtype=torch.bfloat16),
            "half": (torch.ones(1, dtype=torch.float16),),
            "double": torch.ones(1, dtype=torch.float64),
            "ids": torch.arange(3),
        }
    )
    assert out["logits"].dtype == torch.float32
    assert out["half"][0].dtype == torch.float32
    assert out["double"].dtype == torch.float64
    assert out["ids"].dtype == torch.long


def test_bf16_has_no_scaler_and_steps_plainly():
    plugin = MixedPrecision("bf16-mixed", device="cpu")
    model, inputs, labels = _regression()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    before = model[0].weight.detach().clone()
    loss = _backward(plugin, model, inputs, labels)
    assert plugin.scaler is None and plugin.pre_backward(loss, model) is loss
    plugin.optimizer_step(optimizer)
    assert not torch.equal(before, model[0].weight)
    assert plugin.state_dict() == {}


# -- float16 training on CPU ----------------------------------------------------------------------
def test_fp16_mixed_trains_on_cpu():
    plugin = MixedPrecision("16-mixed", device="cpu")
    model, inputs, labels = _regression()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.2)
    losses = []
    for _ in range(60):
        losses.append(_backward(plugin, model, inputs, labels).item())
        plugin.optimizer_step(optimizer)
        optimizer.zero_grad()
    assert model[0].weight.dtype == torch.float32
    assert losses[-1] < 0.3 * losses[0]


def test_pre_backward_multiplies_the_loss_by_the_scale():
    plugin = MixedPrecision("16-mixed", device="cpu", scaler=torch.amp.GradScaler("cpu", init_scale=8.0))
    assert plugin.pre_backward(torch.tensor(1.5), None).item() == 12.0


def test_inf_gradient_skips_the_step_and_is_reported():
    plugin = MixedPrecision("16-mixed", device="cpu")
    model, inputs, labels = _regression()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    assert not plugin.last_step_skipped  # nothing stepped yet

    _backward(plugin, model, inputs, labels)
    model[0].weight.grad[0, 0] = float("inf")
    before = [p.detach().clone() for p in model.parameters()]
    scale_before = plugin.scaler.get_scale()
    plugin.optimizer_step(optimizer)
    assert all(torch.equal(b, p) for b, p in zip(before, model.parameters()))
    assert plugin.last_step_skipped
    assert plugin.last_step_skipped  # reading it twice gives the same answer
    assert plugin.scaler.get_scale() == scale_before / 2

    optimizer.zero_grad()
    _backward(plugin, model, inputs, labels)
    plugin.optimizer_step(optimizer)
    assert not plugin.last_step_skipped
    assert not torch.equal(before[0], model[0].weight)


def test_unscale_twice_is_safe_and_gives_the_true_gradients():
    plugin = MixedPrecision("16-mixed", device="cpu", scaler=torch.amp.GradScaler("cpu", init_scale=1024.0))
    model, inputs, labels = _regression()
    reference, _, _ = _regression()
    reference.load_state_dict(model.state_dict())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    _backward(plugin, model, inputs, labels)
    with torch.autocast("cpu", dtype=torch.float16):
        prediction = reference(inputs)
    nn.functional.mse_loss(prediction.float(), labels).backward()

    plugin.unscale_gradients(optimizer)
    plugin.unscale_gradients(optimizer)  # torch's GradScaler would raise here
    torch.testing.assert_close(model[0].weight.grad, reference[0].weight.grad, rtol=1e-2, atol=1e-4)

    expected = model[0].weight.detach() - 0.1 * model[0].weight.grad
    plugin.optimizer_step(optimizer)  # must not unscale a second time
    torch.testing.assert_close(model[0].weight.detach(), expected)

    optimizer.zero_grad()
    _backward(plugin, model, inputs, labels)
    scaled = model[0].weight.grad.clone()
    plugin.unscale_gradients(optimizer)  # a new step: unscaling happens again
    torch.testing.assert_close(model[0].weight.grad * plugin.scaler.get_scale(), scaled)


def test_state_dict_round_trip_restores_the_scale():
    plugin = MixedPrecision("16-mixed", device="cpu")
    model, inputs, labels = _regression()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    _backward(plugin, model, inputs, labels)
    model[0].weight.grad.fill_(float("nan"))
    plugin.optimizer_step(optimizer)
    state = plugin.state_dict()
    assert state["scaler"]["scale"] == 2.0**15

    restored = MixedPrecision("16-mixed", device="cpu")
    restored.load_state_dict(state)
    assert restored.scaler.get_scale() == 2.0**15
    assert not restored.last_step_skipped


def test_scaler_state_loaded_into_bf16_warns():
    state = MixedPrecision("16-mixed", device="cpu").state_dict()
    with pytest.warns(UserWarning, match="uses no scaler"):
        MixedPrecision("bf16-mixed", device="cpu").load_state_dict(state)


def test_closure_runs_before_the_scaled_step():
    plugin = MixedPrecision("16-mixed", device="cpu")
    model, inputs, labels = _regression()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    before = model[0].weight.detach().clone()
    calls = []

    def closure():
        calls.append(1)
        return _backward(plugin, model, inputs, labels)

    result = plugin.optimizer_step(optimizer, closure)
    assert len(calls) == 1
    assert isinstance(result, torch.Tensor) and result.ndim == 0
    assert not torch.equal(before, model[0].weight)


def test_optimizer_that_requires_a_closure_is_an_error_with_fp16():
    plugin = MixedPrecision("16-mixed", device="cpu")
    model, inputs, labels = _regression()
    optimizer = torch.optim.LBFGS(model.parameters())
    with pytest.raises(ValueError, match=r"LBFGS.*'bf16-mixed'"):
        plugin.optimizer_step(optimizer, lambda: _backward(plugin, model, inputs, labels))


def test_lbfgs_works_with_bf16():
    plugin = MixedPrecision("bf16-mixed", device="cpu")
    model, inputs, labels = _regression()
    optimizer = torch.optim.LBFGS(model.parameters(), max_iter=5)

    def closure():
        optimizer.zero_grad()
        return _backward(plugin, model, inputs, labels)

    first = closure().item()
    plugin.optimizer_step(optimizer, closure)
    assert closure().item() < first


# -- a real GPU ---------------------------------------------------------------------------------
@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize(
    ("precision", "dtype"), [("16-mixed", torch.float16), ("bf16-mixed", torch.bfloat16)]
)
def test_mixed_precision_on_cuda(precision, dtype):
    if dtype is torch.bfloat16 and not torch.cuda.is_bf16_supported():
        pytest.skip("this GPU has no bfloat16")
    plugin = MixedPrecision(precision, device="cuda")
    model, inputs, labels = _regression()
    model, inputs, labels = model.cuda(), inputs.cuda(), labels.cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.2)
    with plugin.forward_context():
        assert model(inputs).dtype == dtype
    losses = []
    for _ in range(60):
        losses.append(_backward(plugin, model, inputs, labels).item())
        plugin.optimizer_step(optimizer)
        optimizer.zero_grad()
    assert losses[-1] < 0.3 * losses[0]
    if precision == "16-mixed":
        _backward(plugin, model, inputs, labels)
        model[0].weight.grad[0, 0] = float("inf")
        plugin.optimizer_step(optimizer)
        assert plugin.last_step_skipped


def test_autocast_options_apply_to_every_forward_and_can_be_overridden_per_block() -> None:
    layer = torch.nn.Linear(4, 4)
    disabled = MixedPrecision("bf16-mixed", device="cpu", autocast_kwargs={"enabled": False})
    with disabled.forward_context():
        assert layer(torch.ones(1, 4)).dtype == torch.float32
    with disabled.forward_context(enabled=True):
        assert layer(torch.ones(1, 4)).dtype == torch.bfloat16
