"""drivetrain's Trainer training the GPT, ``precision="bf16-mixed"``, optional ``torch.compile``.

The config's ``strategy`` (default ``"auto"``) also runs it as one-process ``ddp`` or ``fsdp``;
its ``precision`` (default ``"bf16-mixed"``) as ``"fp8"`` (torchao float8 linear layers).
"""

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


def main() -> None:
    config = common.load_config()
    clock = gpt.start_clock(config)
    module = Module(config)
    trainer = dt.Trainer(
        accelerator="cpu" if config.get("dry_run") else "cuda",
        devices=1,
        strategy=config.get("strategy", "auto"),
        precision=config.get("precision", "bf16-mixed"),
        max_steps=config["total_steps"],
        max_epochs=1,
        enable_progress_bar=False,
        enable_checkpointing=False,
        logger=False,
        enable_model_summary=False,
    )
    trainer.fit(module, gpt.build_loader(config))
    # The final loss goes through the module itself: under FSDP it is the sharded root, whose
    # forward gathers the parameters (calling ``module.net`` directly would see shards).
    gpt.report(config, clock, module, rank=trainer.global_rank)


if __name__ == "__main__":
    main()
