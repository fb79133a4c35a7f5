"""drivetrain's Trainer on CPU; with ``log_metric`` in the config, one ``self.log`` per step.

With ``devices`` > 1 it runs DDP through its own launch (the script re-runs itself per rank).
"""

from torch import nn

import drivetrain as dt
from benchmarks.cases import common


class Module(dt.TrainingModule):
    def __init__(self, config: dict, log_metric: bool) -> None:
        super().__init__()
        self.config = config
        self.log_metric = log_metric
        self.net = common.build_model(config)

    def training_step(self, batch, batch_idx):
        features, targets = batch
        loss = common.loss_fn(self.net(features), targets)
        if self.log_metric:
            self.log("loss", loss)
        return loss

    def configure_optimizers(self):
        return common.build_optimizer(self.net, self.config)


def train(config: dict) -> tuple[nn.Module, int]:
    """Train for ``config["total_steps"]`` steps; the trained network and this process's rank."""
    module = Module(config, log_metric=config.get("log_metric", False))
    devices = config.get("devices", 1)
    trainer = dt.Trainer(
        accelerator="cpu",
        devices=devices,
        strategy="ddp" if devices > 1 else "auto",
        max_steps=config["total_steps"],
        max_epochs=1,
        enable_progress_bar=False,
        enable_checkpointing=False,
        logger=False,
        enable_model_summary=False,
    )
    trainer.fit(module, common.build_loader(config))
    return module.net, trainer.global_rank


def main() -> None:
    config = common.load_config()
    clock = common.StepClock()
    model, rank = train(config)
    common.report(config, clock, model, rank=rank)


if __name__ == "__main__":
    main()
