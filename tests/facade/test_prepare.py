"""prepare() and what it returns: order, no double wrapping, optimizers, schedulers, precision."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import drivetrain as dt
from drivetrain.data import PreparedDataLoader
from drivetrain.facade import PrecisionForward, PreparedOptimizer, PreparedScheduler
from drivetrain.utils import GradScalerKwargs


def _objects() -> tuple[nn.Module, torch.optim.Optimizer, DataLoader, torch.optim.lr_scheduler.LRScheduler]:
    model = nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    loader = DataLoader(TensorDataset(torch.randn(8, 3), torch.randn(8, 1)), batch_size=2)
    return model, optimizer, loader, scheduler


def test_prepare_returns_each_object_prepared_in_the_order_given() -> None:
    accelerator = dt.Accelerator(cpu=True)
    model, optimizer, loader, scheduler = _objects()
    prepared = accelerator.prepare(loader, scheduler, model, optimizer)
    assert [type(p) for p in prepared] == [type(prepared[0]), PreparedScheduler, nn.Linear, PreparedOptimizer]
    assert isinstance(prepared[0], PreparedDataLoader)
    assert prepared[2] is model, "one 32-bit CPU process: the module is used as it is, not wrapped"
    assert isinstance(prepared[3], torch.optim.Optimizer) and prepared[3].optimizer is optimizer
    assert prepared[1].optimizers == [prepared[3]]
    again = accelerator.prepare(model, optimizer, loader, scheduler, *prepared)
    assert again == (prepared[2], prepared[3], prepared[0], prepared[1], *prepared), "never prepared twice"
    assert accelerator.prepare(model) is model
    with pytest.warns(UserWarning, match="returns the str it was given unchanged"):
        assert accelerator.prepare("tokenizer") == "tokenizer"
    with pytest.raises(ValueError, match="device_placement has 1 entries for 2 objects"):
        accelerator.prepare(model, optimizer, device_placement=[True])


def test_the_prepared_optimizer_behaves_like_the_original() -> None:
    accelerator = dt.Accelerator(cpu=True)
    model, optimizer, _, _ = _objects()
    model, prepared = accelerator.prepare(model, optimizer)
    assert prepared.param_groups is optimizer.param_groups and prepared.defaults is optimizer.defaults
    prepared.param_groups[0]["lr"] = 0.5
    assert optimizer.param_groups[0]["lr"] == 0.5
    model(torch.ones(1, 3)).sum().backward()
    before = model.weight.detach().clone()
    prepared.step()
    torch.testing.assert_close(model.weight.detach(), before - 0.5)
    prepared.zero_grad()
    assert model.weight.grad is None
    assert prepared.state_dict() == optimizer.state_dict()
    seen = []
    prepared.register_step_post_hook(lambda opt, args, kwargs: seen.append(opt))
    model(torch.ones(1, 3)).sum().backward()
    prepared.step()
    assert seen == [optimizer]
    assert not prepared.step_was_skipped and not accelerator.optimizer_step_was_skipped


def test_a_scheduler_built_on_the_prepared_optimizer_steps_without_warnings() -> None:
    accelerator = dt.Accelerator(cpu=True)
    model = accelerator.prepare(nn.Linear(2, 1))
    optimizer = accelerator.prepare(torch.optim.SGD(model.parameters(), lr=1.0))
    scheduler = accelerator.prepare(torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.1))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model(torch.ones(1, 2)).sum().backward()
        optimizer.step()
        scheduler.step()
    assert scheduler.get_last_lr() == pytest.approx([0.1])
    assert scheduler.state_dict()["last_epoch"] == 1


def test_one_cycle_is_not_stepped_past_its_end() -> None:
    accelerator = dt.Accelerator(cpu=True)
    model = nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    one_cycle = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=1.0, total_steps=2)
    model, optimizer, one_cycle = accelerator.prepare(model, optimizer, one_cycle)
    for _ in range(4):
        optimizer.step()
        one_cycle.step()  # torch raises past total_steps; the prepared one stops there
    assert one_cycle.last_epoch == 2


def test_full_precision_leaves_forward_alone_and_mixed_precision_wraps_it() -> None:
    plain = dt.Accelerator(cpu=True).prepare(nn.Linear(2, 2))
    assert "forward" not in plain.__dict__
    accelerator = dt.Accelerator(cpu=True, mixed_precision="bf16")
    model = nn.Linear(2, 2)
    prepared = accelerator.prepare(model)
    assert isinstance(prepared.__dict__["forward"], PrecisionForward)
    assert prepared(torch.randn(1, 2)).dtype == torch.float32
    assert accelerator.prepare(model) is prepared, "no second wrapper"
    unwrapped = accelerator.unwrap_model(prepared, keep_fp32_wrapper=False)
    assert unwrapped is model and "forward" not in model.__dict__
    with accelerator.autocast():
        assert model(torch.randn(1, 2)).dtype == torch.bfloat16


def test_evaluation_mode_and_a_true_half_precision_model() -> None:
    accelerator = dt.Accelerator(cpu=True, precision="bf16-true")
    model = accelerator.prepare_model(nn.Linear(2, 2), evaluation_mode=True)
    assert model.weight.dtype == torch.bfloat16
    assert model(torch.randn(1, 2)).dtype == torch.float32, "inputs cast in, outputs cast back"


def test_a_double_precision_model_keeps_its_complex_buffer() -> None:
    accelerator = dt.Accelerator(cpu=True, precision="64-true")
    model = nn.Linear(2, 1)
    model.register_buffer("filter", torch.tensor([2.0 - 1.0j]))
    prepared = accelerator.prepare_model(model)
    assert prepared.weight.dtype == torch.float64
    assert prepared.filter.dtype == torch.complex64 and torch.equal(
        prepared.filter, torch.tensor([2.0 - 1.0j])
    )


def test_clip_grad_norm_unscales_fp16_gradients_first() -> None:
    # A small initial scale: 65536 times these gradients overflows float16 (and skips the step).
    accelerator = dt.Accelerator(
        cpu=True, mixed_precision="fp16", kwargs_handlers=[GradScalerKwargs(init_scale=4.0)]
    )
    model = nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    model, optimizer = accelerator.prepare(model, optimizer)
    accelerator.backward(model(torch.ones(2, 4)).sum())
    norm = accelerator.clip_grad_norm_(model.parameters(), max_norm=1e6)
    expected = torch.tensor([2.0] * 4 + [2.0]).norm()
    torch.testing.assert_close(norm, expected, rtol=1e-3, atol=1e-3)
    accelerator.clip_grad_value_(model.parameters(), 0.5)
    assert model.weight.grad.abs().max() <= 0.5
    optimizer.step()
    assert not accelerator.optimizer_step_was_skipped
    accelerator.backward(model(torch.full((2, 4), 1e5)).sum())  # overflows float16
    optimizer.step()
    assert accelerator.optimizer_step_was_skipped


def test_accumulation_skips_optimizer_steps_and_warns_without_accumulate() -> None:
    accelerator = dt.Accelerator(cpu=True, gradient_accumulation_steps=2)
    model, optimizer, loader, scheduler = accelerator.prepare(*_objects())
    flags = []
    for x, y in loader:  # 4 batches
        with accelerator.accumulate(model):
            accelerator.backward(nn.functional.mse_loss(model(x), y))
            flags.append((accelerator.sync_gradients, model.weight.grad is not None))
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
    assert flags == [(False, True), (True, True), (False, True), (True, True)]
    assert scheduler.get_last_lr() == pytest.approx([0.25]), "stepped twice, with the optimizer"
    other = dt.Accelerator(cpu=True, gradient_accumulation_steps=2)
    with pytest.warns(UserWarning, match=r"does not use `with accelerator.accumulate\(model\):`"):
        other.backward(torch.ones(1, requires_grad=True).sum())


def test_free_memory_forgets_prepared_objects() -> None:
    accelerator = dt.Accelerator(cpu=True)
    model, optimizer, _, _ = accelerator.prepare(*_objects())
    assert accelerator.free_memory(model, optimizer) == [None, None]
    assert accelerator.prepare(model) is model and accelerator._objects.optimizers == []


def test_an_epoch_scheduler_steps_on_every_call() -> None:
    accelerator = dt.Accelerator(cpu=True, gradient_accumulation_steps=2, step_scheduler_with_optimizer=False)
    model, optimizer, _, scheduler = accelerator.prepare(*_objects())
    syncs = []
    for _ in range(2):
        with accelerator.accumulate(model):
            syncs.append(accelerator.sync_gradients)
            optimizer.step()
            with warnings.catch_warnings():
                # torch notices that the optimizer has not stepped yet (it is accumulating): true.
                warnings.simplefilter("ignore", UserWarning)
                scheduler.step()
    assert syncs == [False, True]
    assert scheduler.get_last_lr() == pytest.approx([0.25]), (
        "stepped at both calls, not only with the optimizer"
    )
