"""The GPU work of ``tests/strategies/test_sharded_cuda.py``, run in a fresh spawned process.

CUDA autograd starts worker threads, after which ``fork`` is unsafe: running this work in the
pytest process would break every later test that forks ranks (``helpers.multiprocess``). Each
function builds its strategy, trains, tears down, and returns plain observations.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch

import drivetrain as dt
from helpers.sharded import LR, Net, batches, loss_of


def _start(strategy: Any, precision: str | None = None) -> Any:
    strategy = dt.connect(accelerator="cuda", strategy=strategy, devices=1, precision=precision)
    strategy.setup_environment()
    return strategy


def _train(strategy: Any, model: Any, optimizer: Any, data: list[Any]) -> list[float]:
    losses = []
    precision = strategy.precision
    for x, y in data:
        x, y = strategy.batch_to_device((x, y))
        with precision.forward_context():
            output = precision.convert_output(model(precision.convert_input(x)))
        loss = loss_of(output, y)
        strategy.backward(loss, model)
        strategy.optimizer_step(optimizer, model=model)
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


def fsdp_bf16_offload_meta_init_resume(folder: str) -> dict[str, Any]:
    from drivetrain.strategies import FSDPStrategy

    strategy = _start(FSDPStrategy(auto_wrap_policy={torch.nn.Linear}, cpu_offload=True), "bf16-mixed")
    try:
        observed: dict[str, Any] = {"backend": strategy.process_group_backend}
        with strategy.module_init_context(empty_init=True):
            model = Net()
        observed["built_on_meta"] = next(model.parameters()).is_meta
        optimizer = torch.optim.Adam(model.parameters(), lr=LR)
        model, [optimizer] = strategy.setup_module_and_optimizers(model, [optimizer])
        observed["shard_device"] = next(model.parameters()).to_local().device.type
        seen: list[tuple[torch.dtype, str]] = []
        model.head.register_forward_pre_hook(lambda m, a: seen.append((m.weight.dtype, m.weight.device.type)))
        data = batches(4, world_size=1)
        _train(strategy, model, optimizer, data[:2])
        observed["gathered"] = seen[0]
        strategy.save_state(f"{folder}/ckpt", {"model": model, "optimizer": optimizer})
        _train(strategy, model, optimizer, data[2:])
        uninterrupted = strategy.get_module_state_dict(model)
        with strategy.module_init_context(empty_init=True):
            again = Net()
        again_optimizer = torch.optim.Adam(again.parameters(), lr=LR)
        again, [again_optimizer] = strategy.setup_module_and_optimizers(again, [again_optimizer])
        strategy.load_state(f"{folder}/ckpt", {"model": again, "optimizer": again_optimizer})
        _train(strategy, again, again_optimizer, data[2:])
        resumed = strategy.get_module_state_dict(again)
        observed["resumed_exactly"] = all(torch.equal(resumed[k], v) for k, v in uninterrupted.items())
        return observed
    finally:
        strategy.teardown()


def fsdp_fp32_losses(steps: int) -> list[float]:
    strategy = _start("fsdp")
    try:
        torch.manual_seed(0)
        model = Net()  # built on the CPU, with the CPU generator the reference uses; FSDP moves it
        optimizer = torch.optim.Adam(model.parameters(), lr=LR)
        model, [optimizer] = strategy.setup_module_and_optimizers(model, [optimizer])
        return _train(strategy, model, optimizer, batches(steps, world_size=1))
    finally:
        strategy.teardown()


def deepspeed_losses(name: str, precision: str | None) -> dict[str, Any]:
    # DeepSpeed 0.19.8 calls collectives torch deprecated; not ours to fix.
    warnings.filterwarnings("ignore", category=FutureWarning)
    strategy = _start(name, precision)
    try:
        torch.manual_seed(0)
        model = Net()  # on the CPU, as the reference (zero.Init itself is covered by the CPU tests)
        optimizer = torch.optim.Adam(model.parameters(), lr=LR)
        engine, [optimizer] = strategy.setup_module_and_optimizers(model, [optimizer])
        losses = _train(strategy, engine, optimizer, batches(6, world_size=1))
        return {"losses": losses, "dtype": next(engine.parameters()).dtype, "device": engine.device.type}
    finally:
        strategy.teardown()
