"""Hugging Face Accelerate training the GPT, ``mixed_precision="bf16"``, optional ``torch.compile``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from accelerate import Accelerator
from torch import nn

from benchmarks.cases import common, gpt


def train(config: dict[str, Any], hold: Callable[[nn.Module], None] | None = None) -> nn.Module:
    """``config["total_steps"]`` steps of Accelerate's prepared loop; returns the unwrapped model."""
    accelerator = Accelerator(mixed_precision="bf16", cpu=bool(config.get("dry_run")))
    model = gpt.build_model(config)
    if hold is not None:
        hold(model)
    if config.get("compile"):
        model.compile(backend=gpt.compile_backend(config))
    optimizer = gpt.build_optimizer(model, config)
    prepared, optimizer, loader = accelerator.prepare(model, optimizer, gpt.build_loader(config))
    for inputs, targets in loader:
        optimizer.zero_grad(set_to_none=True)
        loss = gpt.loss_fn(prepared(inputs), targets)
        accelerator.backward(loss)
        optimizer.step()
    return accelerator.unwrap_model(prepared)


def main() -> None:
    config = common.load_config()
    clock = gpt.start_clock(config)
    gpt.report(config, clock, train(config))


if __name__ == "__main__":
    main()
