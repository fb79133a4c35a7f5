"""Hugging Face Accelerate on CPU: prepare / backward around the raw loop.

Under a launcher (``accelerate launch`` / ``drivetrain launch``) the same script runs DDP.
"""

from accelerate import Accelerator
from torch import nn

from benchmarks.cases import common


def train(config: dict) -> tuple[nn.Module, int]:
    """Train for ``config["total_steps"]`` steps; the trained module and this process's rank."""
    accelerator = Accelerator(cpu=True)
    model = common.build_model(config)
    optimizer = common.build_optimizer(model, config)
    model, optimizer, loader = accelerator.prepare(model, optimizer, common.build_loader(config))
    for features, targets in loader:
        optimizer.zero_grad(set_to_none=True)
        loss = common.loss_fn(model(features), targets)
        accelerator.backward(loss)
        optimizer.step()
    return accelerator.unwrap_model(model), accelerator.process_index


def main() -> None:
    config = common.load_config()
    clock = common.StepClock()
    model, rank = train(config)
    common.report(config, clock, model, rank=rank)


if __name__ == "__main__":
    main()
