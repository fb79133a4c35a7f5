"""Per-rank memory and step time of DDP, FSDP and DeepSpeed ZeRO 1/2/3 on the same model.

Two CPU processes over gloo (forked by drivetrain's own launchers), one MLP, Adam, float32.
For each strategy and rank it counts the bytes of the tensors that rank holds: parameters
(its shards under FSDP and ZeRO-3), Adam's state, and, for DeepSpeed, the float32 partition
its ZeRO optimizer steps (a copy beside the module's parameters); plus the growth of the
process's resident memory over set-up and training, and the median step time.

Run from the repository root (deepspeed installed for the ZeRO rows)::

    .venv/bin/python -m benchmarks.sharded_memory            # writes benchmarks/results/sharded-memory.md
    .venv/bin/python -m benchmarks.sharded_memory --width 512 --steps 5   # quicker
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import nn

RESULTS = Path(__file__).resolve().parent / "results"
MiB = 2**20


def build_model(width: int, depth: int) -> nn.Module:
    layers: list[nn.Module] = [nn.Linear(64, width), nn.ReLU()]
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.ReLU()]
    layers.append(nn.Linear(width, 1))
    return nn.Sequential(*layers)


def _bytes(tensors: Any) -> int:
    from torch.distributed.tensor import DTensor

    total = 0
    for tensor in tensors:
        if isinstance(tensor, DTensor):
            tensor = tensor.to_local()
        if isinstance(tensor, torch.Tensor):
            total += tensor.numel() * tensor.element_size()
    return total


def _optimizer_state_bytes(optimizer: torch.optim.Optimizer) -> int:
    return _bytes(
        v for state in optimizer.state.values() for v in state.values() if getattr(v, "dim", lambda: 0)()
    )


def _held(kind: str, strategy: Any, model: Any, optimizer: Any) -> dict[str, int]:
    """Bytes of parameters and optimizer-held tensors this rank owns."""
    if kind != "deepspeed":
        return {"params": _bytes(model.parameters()), "optimizer": _optimizer_state_bytes(optimizer)}
    module_params = list(model.module.parameters())
    if strategy.stage == 3:
        params = sum(p.ds_tensor.numel() * p.ds_tensor.element_size() for p in module_params)
    else:
        params = _bytes(module_params)
    inner = optimizer.optimizer  # the torch Adam DeepSpeed drives, over its float32 partitions
    own = {id(p) for p in module_params}
    partitions = _bytes(p for group in inner.param_groups for p in group["params"] if id(p) not in own)
    return {"params": params, "optimizer": _optimizer_state_bytes(inner) + partitions}


def _rank(strategy: Any, kind: str, width: int, depth: int, batch: int, steps: int) -> dict[str, Any]:
    import psutil

    warnings.simplefilter("ignore", FutureWarning)  # DeepSpeed's use of deprecated torch collectives
    strategy.setup_environment()
    process = psutil.Process()
    rss_before = process.memory_info().rss
    torch.manual_seed(0)
    model = build_model(width, depth)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    model, [optimizer] = strategy.setup_module_and_optimizers(model, [optimizer])
    generator = torch.Generator().manual_seed(strategy.global_rank)
    x, y = torch.randn(batch, 64, generator=generator), torch.randn(batch, 1, generator=generator)
    times = []
    for step in range(steps + 3):
        start = time.perf_counter()
        loss = ((model(x) - y) ** 2).mean()
        strategy.backward(loss, model)
        strategy.optimizer_step(optimizer, model=model)
        optimizer.zero_grad()
        if step >= 3:  # the first steps allocate state and warm up
            times.append(time.perf_counter() - start)
    report = {
        "rank": strategy.global_rank,
        **_held(kind, strategy, model, optimizer),
        "rss_growth": process.memory_info().rss - rss_before,
        "step_ms": 1000 * statistics.median(times),
    }
    gathered = strategy.all_gather_object(report)
    strategy.barrier()
    return {"ranks": gathered}


def _strategies(with_deepspeed: bool) -> list[tuple[str, str, Any]]:
    from drivetrain.strategies import DDPStrategy, FSDPStrategy

    rows: list[tuple[str, str, Any]] = [
        ("DDP", "ddp", lambda: DDPStrategy(start_method="fork")),
        ("FSDP2 (one group)", "fsdp", lambda: FSDPStrategy(start_method="fork")),
        (
            "FSDP2 (per Linear)",
            "fsdp",
            lambda: FSDPStrategy(start_method="fork", auto_wrap_policy={nn.Linear}),
        ),
    ]
    if with_deepspeed:
        from drivetrain.strategies import DeepSpeedStrategy

        for stage in (1, 2, 3):
            rows.append(
                (
                    f"DeepSpeed ZeRO-{stage}",
                    "deepspeed",
                    lambda s=stage: DeepSpeedStrategy(stage=s, start_method="fork"),
                )
            )
    return rows


def main(argv: list[str] | None = None) -> int:
    import drivetrain as dt
    from drivetrain._utilities.imports import package_available

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--depth", type=int, default=8)
    parser.add_argument("--batch", type=int, default=64, help="samples per rank per step")
    parser.add_argument("--steps", type=int, default=10, help="timed steps (after 3 warm-up steps)")
    parser.add_argument("--output", type=Path, default=RESULTS / "sharded-memory.md")
    args = parser.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")

    total_params = sum(p.numel() for p in build_model(args.width, args.depth).parameters())
    lines = [
        "# Per-rank memory and step time: DDP vs FSDP vs DeepSpeed ZeRO (2 CPU ranks, gloo)",
        "",
        f"Model: MLP 64 -> {args.depth} x {args.width} -> 1, {total_params / 1e6:.2f} M parameters "
        f"({total_params * 4 / MiB:.1f} MiB float32; Adam state {2 * total_params * 4 / MiB:.1f} MiB). "
        f"Batch {args.batch} per rank, float32, median of {args.steps} steps after 3 warm-up steps.",
        f"Machine: {platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, "
        f"Python {platform.python_version()}; produced by `python -m benchmarks.sharded_memory`. Load average "
        f"at the start {os.getloadavg()[0]:.1f} (step times on a shared 2-core machine are noisy; the byte "
        f"counts are exact).",
        "",
        "`params` = parameter bytes the rank holds; `optimizer` = Adam state (+ DeepSpeed's float32 partition "
        "copy); `RSS growth` = the process's resident memory growth over set-up and training (allocator and "
        "communication buffers included).",
        "",
        "| strategy | rank | params MiB | optimizer MiB | params+optimizer MiB | RSS growth MiB | step ms |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for label, kind, make in _strategies(package_available("deepspeed")):
        strategy = dt.connect(accelerator="cpu", strategy=make(), devices=2)
        result = strategy.launcher.launch(
            _rank, strategy, kind, args.width, args.depth, args.batch, args.steps
        )
        for rank in sorted(result["ranks"], key=lambda r: r["rank"]):
            held = rank["params"] + rank["optimizer"]
            lines.append(
                f"| {label} | {rank['rank']} | {rank['params'] / MiB:.1f} | {rank['optimizer'] / MiB:.1f} | "
                f"{held / MiB:.1f} | {rank['rss_growth'] / MiB:.1f} | {rank['step_ms']:.1f} |"
            )
        print(lines[-2], lines[-1], sep="\n", flush=True)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text("\n".join(lines) + "\n")
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
