"""Lightning Fabric on CPU: setup / setup_dataloaders / backward around the raw loop.

With ``devices`` > 1 in the config, Fabric launches the other processes itself (``ddp``).
"""

from lightning.fabric import Fabric

from benchmarks.cases import common


def main() -> None:
    config = common.load_config()
    clock = common.StepClock()
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
    common.report(config, clock, model.module, rank=fabric.global_rank)


if __name__ == "__main__":
    main()
