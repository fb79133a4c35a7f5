"""Lightning Fabric on CPU: setup / setup_dataloaders / backward around the raw loop.

With ``devices`` > 1 in the config, Fabric launches the other processes itself (``ddp``).
"""

from lightning.fabric import Fabric
from torch import nn

from benchmarks.cases import common


def train(config: dict) -> tuple[nn.Module, int]:
    """Train for ``config["total_steps"]`` steps; the trained module and this process's rank."""
    devices = config.get("devices", 1)
    fabric = Fabric(accelerator="cpu", devices=devices, strategy="ddp" if devices > 1 else "auto")
    fabric.launch()
    model = common.build_model(config)
    optimizer = common.build_optimizer(model, config)
    model, optimizer = fabric.setup(model, optimizer)
    loader = fabric.setup_dataloaders(common.build_loader(config))
    for features, targets in loader:
        optimizer.zero_grad(set_to_none=True)
        loss = common.loss_fn(model(features), targets)
        fabric.backward(loss)
        optimizer.step()
    return model.module, fabric.global_rank


def main() -> None:
    config = common.load_config()
    clock = common.StepClock()
    model, rank = train(config)
    common.report(config, clock, model, rank=rank)


if __name__ == "__main__":
    main()
