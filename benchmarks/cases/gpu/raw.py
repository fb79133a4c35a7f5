"""Raw PyTorch GPT training: autocast bf16, optional ``torch.compile``; float8 by hand; DDP or FSDP2 under torchrun.

``train(config)`` is the single-device loop (the in-process A/B of the GPU check imports it):
bf16 autocast with float32 weights, ``model.compile()`` when ``compile`` is set, and with
``precision="fp8"`` torchao's float8 linear layers as torchao's README shows (convert, then
compile) on the layers drivetrain's ``"fp8"`` converts by default (:func:`gpt.float8_layers`).
Under ``torchrun`` the config's ``parallel`` picks ``DistributedDataParallel`` or FSDP2
(``fully_shard`` per block, then the root), with the same recipe, so the three differ only in the
wrapper.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DistributedSampler

from benchmarks.cases import common, gpt


def convert_to_float8(model: nn.Module) -> None:
    """torchao's float8 linear layers (tensorwise scaling) in place of :func:`gpt.float8_layers`."""
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    chosen = set(gpt.float8_layers(model))
    convert_to_float8_training(
        model,
        config=Float8LinearConfig.from_recipe_name("tensorwise"),
        module_filter_fn=lambda module, fqn: fqn in chosen,
    )


def prepare(config: dict[str, Any], hold: Callable[[nn.Module], None] | None = None) -> nn.Module:
    """The model on its device, converted to float8 and compiled as the config asks."""
    model = gpt.build_model(config).to(gpt.device_for(config))
    if hold is not None:
        hold(model)
    if config.get("precision") == "fp8":
        convert_to_float8(model)
    if config.get("compile"):
        model.compile(backend=gpt.compile_backend(config))
    return model


def train(config: dict[str, Any], hold: Callable[[nn.Module], None] | None = None) -> nn.Module:
    """``config["total_steps"]`` steps of the single-device loop; returns the trained model.

    ``hold`` receives the model as soon as it exists (the A/B program's final loss needs it even
    when it stops a training early).
    """
    device = gpt.device_for(config)
    model = prepare(config, hold)
    optimizer = gpt.build_optimizer(model, config)
    for inputs, targets in gpt.build_loader(config):
        inputs = inputs.to(device, non_blocking=True)
        targets = targets.to(device, non_blocking=True)
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss = gpt.loss_fn(model(inputs), targets)
        loss.backward()
        optimizer.step()
    return model


def main() -> None:
    config = common.load_config()
    if "RANK" not in os.environ:
        clock = gpt.start_clock(config)
        gpt.report(config, clock, train(config))
        return
    if not config.get("dry_run"):
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    device = gpt.device_for(config)
    clock = gpt.start_clock(config)
    model = prepare(config)
    dataset = gpt.build_dataset(config)
    dist.init_process_group("gloo" if device.type == "cpu" else "nccl")
    sampler = DistributedSampler(dataset, shuffle=False)
    train_model: nn.Module = model
    if config["parallel"] == "fsdp":
        from torch.distributed.fsdp import fully_shard

        for block in model.blocks:  # type: ignore[attr-defined]
            fully_shard(block)
        fully_shard(model)
    else:
        train_model = DistributedDataParallel(model, device_ids=None if device.type == "cpu" else [device])
    optimizer = gpt.build_optimizer(train_model, config)
    for inputs, targets in gpt.build_loader(config, dataset, sampler):
        inputs = inputs.to(device, non_blocking=True)
        targets = targets.to(device, non_blocking=True)
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss = gpt.loss_fn(train_model(inputs), targets)
        loss.backward()
        optimizer.step()
    gpt.report(config, clock, model, rank=dist.get_rank())
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
