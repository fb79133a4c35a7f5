"""Lightning's Trainer on CPU; with ``log_metric`` in the config, one ``self.log`` per step.

With ``devices`` > 1 it runs DDP through its own launch (the script re-runs itself per rank).
Lightning replaces a training loader's sampler with a *shuffling* ``DistributedSampler`` even when
the loader says ``shuffle=False``, which would make it train on other rows than every other
variant; so under DDP this script turns that off (``use_distributed_sampler=False``) and shards
with an unshuffled ``DistributedSampler`` itself, as Lightning users do to keep their order.
"""

import lightning as L
from torch import nn
from torch.utils.data import DistributedSampler

from benchmarks.cases import common


class Module(L.LightningModule):
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

    def train_dataloader(self):
        dataset = common.build_dataset(self.config)
        sampler = None
        if self.trainer.world_size > 1:
            sampler = DistributedSampler(
                dataset, num_replicas=self.trainer.world_size, rank=self.trainer.global_rank, shuffle=False
            )
        return common.build_loader(self.config, dataset, sampler)

    def configure_optimizers(self):
        return common.build_optimizer(self.net, self.config)


def train(config: dict) -> tuple[nn.Module, int]:
    """Train for ``config["total_steps"]`` steps; the trained network and this process's rank."""
    module = Module(config, log_metric=config.get("log_metric", False))
    devices = config.get("devices", 1)
    trainer = L.Trainer(
        accelerator="cpu",
        devices=devices,
        strategy="ddp" if devices > 1 else "auto",
        max_steps=config["total_steps"],
        max_epochs=1,
        enable_progress_bar=False,
        enable_checkpointing=False,
        logger=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        use_distributed_sampler=False,
    )
    trainer.fit(module)
    return module.net, trainer.global_rank


def main() -> None:
    config = common.load_config()
    clock = common.StepClock()
    model, rank = train(config)
    common.report(config, clock, model, rank=rank)


if __name__ == "__main__":
    main()
