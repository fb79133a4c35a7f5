"""drivetrain's Trainer training the GPT, ``precision="bf16-mixed"``, optional ``torch.compile``.

The config's ``strategy`` (default ``"auto"``) also runs it as one-process ``ddp`` or ``fsdp``;
its ``precision`` (default ``"bf16-mixed"``) as ``"fp8"``: torchao float8 linear layers, which
drivetrain compiles itself (``fp8_compile``: ``"model"``, the default, or ``"layers"``) unless
``compile`` is set, in which case the script compiles the network as for bf16 and drivetrain
leaves the float8 layers to that compilation.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import nn

import drivetrain as dt
from benchmarks.cases import common, gpt


class Module(dt.TrainingModule):
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


def precision(config: dict[str, Any]) -> Any:
    """The precision setting: a name, or for ``"fp8"`` a ``Float8Precision`` with the compile mode asked for."""
    name = config.get("precision", "bf16-mixed")
    if name != "fp8":
        return name
    from drivetrain.plugins.precision import Float8Precision

    options: dict[str, Any] = {"compile": config.get("fp8_compile", "model")}
    if config.get("dry_run"):
        # A dry run emulates float8 on the CPU (torch's float8 matmul has a CPU kernel), which the
        # precision refuses for real training; only the wiring is checked, and the compile is
        # torch.compile's eager backend, as for the other compiled dry-run variants.
        from drivetrain.plugins.precision import fp8

        fp8.check_float8_hardware = lambda device_type: None
        options.update(device="cpu", compile_options={"backend": gpt.compile_backend(config)})
    return Float8Precision(**options)


def train(
    config: dict[str, Any], hold: Callable[[nn.Module], None] | None = None
) -> tuple[dt.Trainer, Module]:
    """``config["total_steps"]`` steps through ``Trainer.fit``; returns the trainer and the module."""
    module = Module(config)
    if hold is not None:
        hold(module)
    trainer = dt.Trainer(
        accelerator="cpu" if config.get("dry_run") else "cuda",
        devices=1,
        strategy=config.get("strategy", "auto"),
        precision=precision(config),
        max_steps=config["total_steps"],
        max_epochs=1,
        enable_progress_bar=False,
        enable_checkpointing=False,
        logger=False,
        enable_model_summary=False,
    )
    trainer.fit(module, gpt.build_loader(config))
    return trainer, module


def main() -> None:
    config = common.load_config()
    clock = gpt.start_clock(config)
    trainer, module = train(config)
    # The final loss goes through the module itself: under FSDP it is the sharded root, whose
    # forward gathers the parameters (calling ``module.net`` directly would see shards).
    gpt.report(config, clock, module, rank=trainer.global_rank)


if __name__ == "__main__":
    main()
