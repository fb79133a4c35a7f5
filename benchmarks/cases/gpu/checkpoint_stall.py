"""How long a checkpoint save holds up GPU training: synchronous against ``AsyncCheckpointIO``.

The raw loop trains the benchmark GPT (``size`` in the config; the 111 M model on a GPU) with
AdamW; its checkpoint is the model's and the optimizer's state dicts (weights and both Adam
moments: ~1.3 GB for the 111 M model). Each round, in alternating order:

- **synchronous save**: ``TorchCheckpointIO().save_checkpoint`` (copy to the host, serialise,
  fsync, rename), timed on the host;
- **background save**: ``AsyncCheckpointIO().save_checkpoint`` followed by one training step,
  waited for on the GPU; its *stall* is that time minus the median of the plain steps measured
  just before (what the loop lost to the save). The background write is then waited for
  (outside the timing) so that rounds do not overlap.

The targets: the stall at most 5 % of the synchronous save and at most one step. One JSON line
per round goes to ``record`` (kept if the process is killed at its time cap); rounds go on until
``seconds`` once there are 3, and none starts that would end after ``hard_seconds``; the answer is one
``BENCH_RESULT`` line with every round.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks.cases import common, gpt
from drivetrain.plugins.io import AsyncCheckpointIO, TorchCheckpointIO


def main() -> None:
    config = common.load_config()
    started = time.monotonic()
    dry = bool(config.get("dry_run"))
    device = gpt.device_for(config)
    synchronize = (lambda: None) if dry else torch.cuda.synchronize
    model = gpt.build_model(config).to(device)
    optimizer = gpt.build_optimizer(model, config)
    batches = [tuple(t.to(device) for t in batch) for batch in gpt.build_loader({**config, "total_steps": 4})]

    def step(index: int) -> None:
        inputs, targets = batches[index % len(batches)]
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss = gpt.loss_fn(model(inputs), targets)
        loss.backward()
        optimizer.step()

    def timed_steps(count: int) -> list[float]:
        times = []
        for index in range(count):
            synchronize()
            begin = time.perf_counter()
            step(index)
            synchronize()
            times.append(time.perf_counter() - begin)
        return times

    timed_steps(3)  # warm-up: kernels, allocator, Adam's state
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
    state_bytes = sum(t.numel() * t.element_size() for t in _tensors(state))
    record = Path(config["record"]) if config.get("record") else None
    rounds: list[dict[str, Any]] = []
    first_async_stall_s = None
    with tempfile.TemporaryDirectory(prefix="drivetrain-ckpt-", dir=config.get("directory")) as folder:
        plain_io, background_io = TorchCheckpointIO(), AsyncCheckpointIO()
        # Warm-up: the first background save pins its host buffers (kept for the later saves).
        step_s = statistics.median(timed_steps(3))
        synchronize()
        begin = time.perf_counter()
        background_io.save_checkpoint(state, Path(folder) / "first.ckpt")
        step(0)
        synchronize()
        first_async_stall_s = time.perf_counter() - begin - step_s
        background_io.remove_checkpoint(Path(folder) / "first.ckpt")
        last_round = 0.0
        for index in range(config["rounds"]):
            elapsed = time.monotonic() - started
            soft = elapsed > config.get("seconds", float("inf")) and index >= 3
            hard = elapsed + last_round > config.get("hard_seconds", float("inf"))
            if soft or hard:
                _log(f"deadline reached after {index} rounds")
                break
            step_s = statistics.median(timed_steps(config.get("plain_steps", 3)))
            measured: dict[str, float] = {"step_s": step_s}
            for kind in ("sync", "async") if index % 2 == 0 else ("async", "sync"):
                path = Path(folder) / f"{kind}-{index}.ckpt"
                synchronize()
                begin = time.perf_counter()
                if kind == "sync":
                    plain_io.save_checkpoint(state, path)
                    measured["sync_save_s"] = time.perf_counter() - begin
                    plain_io.remove_checkpoint(path)
                else:
                    background_io.save_checkpoint(state, path)
                    measured["async_call_s"] = time.perf_counter() - begin
                    step(index)
                    synchronize()
                    measured["async_stall_s"] = time.perf_counter() - begin - step_s
                    background_io.remove_checkpoint(path)  # waits for the write, outside the timing
            last_round = time.monotonic() - started - elapsed
            rounds.append(measured)
            _log(f"  round {index + 1}: " + ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in measured.items()))
            if record is not None:
                with record.open("a") as file:
                    file.write(json.dumps({"round": index, **measured}) + "\n")
        background_io.teardown()
    result = {
        "rounds": rounds,
        "state_bytes": state_bytes,
        "first_async_stall_s": first_async_stall_s,
        "torch": torch.__version__,
        "gpu": None if dry else torch.cuda.get_device_name(),
        "drivetrain_file": common.drivetrain_file(),
        "seconds": time.monotonic() - started,
    }
    print(common.RESULT_PREFIX + json.dumps(result), flush=True)


def _tensors(state: Any) -> list[torch.Tensor]:
    found: list[torch.Tensor] = []

    def walk(value: Any) -> None:
        if isinstance(value, torch.Tensor):
            found.append(value)
        elif isinstance(value, dict):
            for item in value.values():
                walk(item)
        elif isinstance(value, (list, tuple)):
            for item in value:
                walk(item)

    walk(state)
    return found


def _log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
