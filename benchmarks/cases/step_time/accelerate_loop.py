"""Hugging Face Accelerate on CPU: prepare / backward around the raw loop.

Under a launcher (``accelerate launch`` / ``drivetrain launch``) the same script runs DDP.
"""

from accelerate import Accelerator

from benchmarks.cases import common


def main() -> None:
    config = common.load_config()
    clock = common.StepClock()
    accelerator = Accelerator(cpu=True)
    model = common.build_model(config)
    optimizer = common.build_optimizer(model, config)
    model, optimizer, loader = accelerator.prepare(model, optimizer, common.build_loader(config))
    for features, targets in loader:
        optimizer.zero_grad(set_to_none=True)
        loss = common.loss_fn(model(features), targets)
        accelerator.backward(loss)
        optimizer.step()
    common.report(config, clock, accelerator.unwrap_model(model), rank=accelerator.process_index)


if __name__ == "__main__":
    main()
