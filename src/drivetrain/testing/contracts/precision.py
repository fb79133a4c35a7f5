"""The precision plugin's contract: its hooks around forward, backward and the optimizer step, and its state.

The central check follows the step the front doors run: convert the module, run the forward pass
in the plugin's context, ``pre_backward`` → ``backward`` → ``post_backward``, then
``unscale_gradients`` (what clipping calls first). Whatever the plugin did to the loss (a loss
scale), the gradients must then be the true gradients of the loss, within the precision's
rounding, or clipping clips the wrong numbers.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import torch
from torch import nn

from drivetrain.plugins import Precision, PrecisionRegistry
from drivetrain.testing.contracts import Check, NotApplicable, same, weights_only_round_trip

#: Steps a loss scaler may skip (halving its scale each time) before the gradients must be finite.
_SCALE_SEARCH_STEPS = 24


def _step_module() -> tuple[nn.Module, torch.Tensor]:
    generator = torch.Generator().manual_seed(3)
    module = nn.Linear(4, 2)
    with torch.no_grad():
        module.weight.copy_(torch.randn(2, 4, generator=generator))
        module.bias.copy_(torch.randn(2, generator=generator))
    return module, torch.randn(8, 4, generator=generator)


def precision_checks(cls: Any, make: Callable[[], Any]) -> list[Check]:
    """The checks for precision class ``cls``; ``make()`` builds one."""
    state: dict[str, Any] = {}

    def subclass() -> str | None:
        if not (isinstance(cls, type) and issubclass(cls, Precision)):
            return f"{cls!r} is not a subclass of drivetrain.plugins.Precision"
        state["plugin"] = make()
        if not isinstance(state["plugin"].name, str):
            return f"name is {state['plugin'].name!r}; declare the precision's name as a string"
        return None

    def contexts() -> str | None:
        plugin = state["plugin"]
        for hook in ("module_init_context", "forward_context"):
            context = getattr(plugin, hook)()
            if not isinstance(context, AbstractContextManager) and not hasattr(context, "__enter__"):
                return f"{hook}() returned {context!r}, not a context manager"
        module = plugin.convert_module(_step_module()[0])
        if not isinstance(module, nn.Module):
            return f"convert_module() returned {type(module).__name__}, not the module"
        return None

    def forward() -> str | None:
        plugin = state["plugin"]
        module, x = _step_module()
        module = plugin.convert_module(module)
        with plugin.forward_context():
            output = plugin.convert_output(module(plugin.convert_input(x)))
        if not isinstance(output, torch.Tensor) or output.shape != (8, 2):
            return f"the forward pass gave {output!r}"
        state["forward"] = True
        return None

    def gradients() -> str | NotApplicable | None:
        if "forward" not in state:
            return NotApplicable("the forward pass above did not run")
        plugin = state["plugin"]
        module, x = _step_module()
        reference = copy.deepcopy(module)
        module = plugin.convert_module(module)
        optimizer = torch.optim.SGD(module.parameters(), lr=0.1)
        state["optimizer"], state["module"] = optimizer, module
        # A loss scaler may start too high and overflow: it skips those steps and lowers the scale, as
        # a training loop would see in its first steps.
        for _ in range(_SCALE_SEARCH_STEPS):
            optimizer.zero_grad()
            with plugin.forward_context():
                output = plugin.convert_output(module(plugin.convert_input(x)))
            loss = output.float().pow(2).mean()
            to_backward = plugin.pre_backward(loss, module)
            plugin.backward(to_backward, module)
            plugin.post_backward(to_backward, module)
            scale = (
                float(to_backward.detach().float()) / float(loss.detach()) if float(loss.detach()) else 1.0
            )
            plugin.unscale_gradients(optimizer)
            finite = all(p.grad is None or bool(torch.isfinite(p.grad).all()) for p in module.parameters())
            if finite or not plugin.skips_nonfinite_steps:
                break
            with torch.no_grad():
                saved = [p.detach().clone() for p in module.parameters()]
                plugin.optimizer_step(optimizer)  # skipped, and the scale lowered
                for parameter, value in zip(module.parameters(), saved, strict=True):
                    parameter.copy_(value)
        reference(x).pow(2).mean().backward()
        for (name, got), want in zip(module.named_parameters(), reference.parameters(), strict=True):
            if got.grad is None or want.grad is None:
                return f"after backward, {name} has no gradient"
            ratio = float(got.grad.float().norm() / want.grad.norm())
            if not torch.allclose(got.grad.float(), want.grad, rtol=0.05, atol=1e-3):
                hint = f" (pre_backward scaled the loss by {scale:g})" if abs(scale - 1) > 1e-3 else ""
                return (
                    f"after unscale_gradients(), the gradient of {name} is {ratio:.1f} times the true one{hint}: "
                    f"clipping and the optimizer would see scaled gradients"
                )
        return None

    def optimizer_step() -> str | NotApplicable | None:
        if "optimizer" not in state:
            return NotApplicable("the backward pass above did not complete")
        plugin, optimizer, module = state["plugin"], state["optimizer"], state["module"]
        before = [p.detach().clone() for p in module.parameters()]
        plugin.optimizer_step(optimizer)
        if not plugin.last_step_skipped and all(
            torch.equal(a, p) for a, p in zip(before, module.parameters(), strict=True)
        ):
            return "optimizer_step() left the parameters unchanged without reporting a skipped step (last_step_skipped)"
        return None

    def nonfinite() -> str | NotApplicable | None:
        plugin = make()
        if not plugin.skips_nonfinite_steps:
            return NotApplicable(
                "skips_nonfinite_steps is False: an inf/NaN gradient is an error when clipping"
            )
        module = plugin.convert_module(_step_module()[0])
        optimizer = torch.optim.SGD(module.parameters(), lr=0.1)
        with plugin.forward_context():
            loss = module(torch.full((1, 4), float("inf"))).float().sum()
        to_backward = plugin.pre_backward(loss, module)
        plugin.backward(to_backward, module)
        before = [p.detach().clone() for p in module.parameters()]
        plugin.optimizer_step(optimizer)
        changed = not all(torch.equal(a, p) for a, p in zip(before, module.parameters(), strict=True))
        if changed or not plugin.last_step_skipped:
            return "skips_nonfinite_steps is True, but a step with inf gradients " + (
                "changed the parameters" if changed else "was not reported in last_step_skipped"
            )
        return None

    def saved_state() -> str | None:
        plugin = state["plugin"]
        saved = plugin.state_dict()
        if not isinstance(saved, dict):
            return f"state_dict() returned {type(saved).__name__}, not a dict"
        try:
            loaded = weights_only_round_trip(saved)
        except Exception as error:
            return f"state_dict() holds what checkpoints cannot ({type(error).__name__}: {error})"
        fresh = make()
        fresh.load_state_dict(loaded)
        if not same(fresh.state_dict(), saved):
            return "load_state_dict(state_dict()) on a new instance does not give the same state_dict()"
        return None

    def registered() -> str | NotApplicable | None:
        names = [entry.name for entry in PrecisionRegistry.describe() if entry.cls is cls]
        if not names:
            return NotApplicable(
                f"{cls.__name__} is not registered: it is passed as an instance (precision={cls.__name__}()); "
                f"PrecisionRegistry.register gives it a name for precision= and the CLI"
            )
        return None

    return [
        Check(
            "precision: subclasses Precision",
            subclass,
            "subclass drivetrain.plugins.Precision (and set name)",
            essential=True,
        ),
        Check(
            "precision: contexts and convert_module",
            contexts,
            "return context managers from forward_context()/module_init_context() and the module from convert_module()",
        ),
        Check(
            "precision: the forward pass runs on converted inputs",
            forward,
            "make convert_input() cast the batch to what convert_module() made of the module (and convert_output() the "
            "outputs back to float32), or run the forward under an autocast in forward_context()",
        ),
        Check(
            "precision: gradients are unscaled before clipping",
            gradients,
            "divide the gradients by the loss scale in unscale_gradients(optimizer) (torch.amp.GradScaler.unscale_), as MixedPrecision does",
        ),
        Check(
            "precision: optimizer_step() steps or reports a skip",
            optimizer_step,
            "call optimizer.step() (through the scaler, if any) in optimizer_step(), and report a skipped step in last_step_skipped",
        ),
        Check(
            "precision: a step with inf gradients is skipped",
            nonfinite,
            "skip the step (GradScaler.step does) and set last_step_skipped, or declare skips_nonfinite_steps = False",
        ),
        Check(
            "precision: state_dict() survives a checkpoint",
            saved_state,
            "return plain tensors and numbers from state_dict() (the scaler's state_dict()) and restore them in load_state_dict()",
        ),
        Check(
            "precision: registered under a name",
            registered,
            "register with PrecisionRegistry.register('name', cls)",
        ),
    ]
