"""Lightning's Trainer training the GPT, ``precision="bf16-mixed"``, optional ``torch.compile``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import lightning as L
from torch import nn

from benchmarks.cases import common, gpt


class Module(L.LightningModule):
    def __init__(self, config: dict) -> None:
        super().__init__()
        self.config = config
        self.net = gpt.build_model(config)
        if config.get("compile"):
            self.net.compile(backend=gpt.compile_backend(config))

    def forward(self, inputs):
        return self.net(inputs)

    def training_step(self, batch, batch_idx):
        inputs, targets = batch
        return gpt.loss_fn(self.net(inputs), targets)

    def configure_optimizers(self):
        return gpt.build_optimizer(self.net, self.config)


def train(config: dict[str, Any], hold: Callable[[nn.Module], None] | None = None) -> tuple[Any, Module]:
    """``config["total_steps"]`` steps through Lightning's ``Trainer.fit``; returns the trainer and the module."""
    module = Module(config)
    if hold is not None:
        hold(module)
    trainer = L.Trainer(
        accelerator="cpu" if config.get("dry_run") else "gpu",
        devices=1,
        precision="bf16-mixed",
        max_steps=config["total_steps"],
        max_epochs=1,
        enable_progress_bar=False,
        enable_checkpointing=False,
        logger=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    trainer.fit(module, gpt.build_loader(config))
    return trainer, module


def main() -> None:
    config = common.load_config()
    clock = gpt.start_clock(config)
    trainer, module = train(config)
    gpt.report(config, clock, module, rank=trainer.global_rank)


if __name__ == "__main__":
    main()
