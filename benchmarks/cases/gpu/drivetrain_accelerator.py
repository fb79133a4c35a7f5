"""drivetrain's Accelerator façade training the GPT, ``mixed_precision="bf16"``, optional compile."""

import drivetrain as dt
from benchmarks.cases import common, gpt


def main() -> None:
    config = common.load_config()
    clock = gpt.start_clock(config)
    accelerator = dt.Accelerator(mixed_precision="bf16", cpu=bool(config.get("dry_run")))
    model = gpt.build_model(config)
    if config.get("compile"):
        model.compile(backend=gpt.compile_backend(config))
    optimizer = gpt.build_optimizer(model, config)
    model, optimizer, loader = accelerator.prepare(model, optimizer, gpt.build_loader(config))
    for inputs, targets in loader:
        optimizer.zero_grad(set_to_none=True)
        loss = gpt.loss_fn(model(inputs), targets)
        accelerator.backward(loss)
        optimizer.step()
    gpt.report(config, clock, accelerator.unwrap_model(model), rank=accelerator.process_index)


if __name__ == "__main__":
    main()
