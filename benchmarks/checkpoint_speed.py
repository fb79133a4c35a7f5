# ruff: noqa: RUF001 (units use the multiplication sign, as in the other reports)
"""Checkpoint speed: drivetrain's checkpoint writer and reader beside plain torch.save / torch.load / DCP.

One run, side by side, rounds interleaved (the order alternates round by round), every ratio with
its 95 % bootstrap interval over the paired rounds (:mod:`benchmarks.intervals`):

* **local save**: a training state (an MLP and its Adam state, ~1 GiB by default) written by
  drivetrain's synchronous save (``write_checkpoint``: the core entries, every process's
  generators, temporary file, fsync, verification, atomic rename) against ``torch.save`` of the
  same model and optimizer state dicts into a file (target <= 1.1x);
* **asynchronous save stall**: how long ``write_checkpoint`` holds the training loop with
  ``AsyncCheckpointIO`` as configured by default (``snapshot="copy"``: the tensors copied into the
  staging memory the previous save used, as in a run that saves repeatedly), as a share of the
  synchronous save (target <= 5 %); beside it the stall of ``snapshot="fork"`` (local, Linux);
* **what a fork moves to the next step**: an in-place update of every state tensor (what an
  optimizer step does) right after a forked save returned, while the child writes, against the
  same update with no save pending: the kernel copies each page the parent writes first
  (copy-on-write), so what a fork takes out of the stall comes back in the next step;
* **the stall's floor**: ``Tensor.copy_`` of the same state into memory allocated beforehand, which
  any snapshot taken before ``write_checkpoint`` returns must do (stall / copy, copy / sync save);
* **load**: drivetrain's ``read_checkpoint`` (safe loading, restoring the objects in place)
  against ``torch.load(weights_only=True)`` + ``load_state_dict``;
* **2-rank sharded save/load** (FSDP2 over gloo, two forked CPU processes): ``strategy.save_state``
  / ``load_state`` (staging, verification, publication) against ``dcp.save`` / ``dcp.load`` of the
  same state dicts;
* the same against a **local S3 server** (moto in server mode on 127.0.0.1, reached through s3fs),
  with a smaller state (moto keeps objects in one Python process: tens of MB/s here).

Run from the repository root::

    .venv/bin/python -m benchmarks.checkpoint_speed                 # ~1 GiB local, 256 MiB on S3
    .venv/bin/python -m benchmarks.checkpoint_speed --mib 64 --s3-mib 16 --rounds 3   # quick

Writes ``benchmarks/results/checkpoint-speed.{md,json}``. The machine's load is recorded before
and after; on a shared machine the times are noisy and the report says so.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from benchmarks.intervals import Measurement, Scale, paired_log_ratios
from benchmarks.load import Load, probe

RESULTS = Path(__file__).resolve().parent / "results"
MiB = 2**20
WIDTH = 2048  # one Linear(2048, 2048) with Adam's two moments holds 48 MiB


def build(mib: int, step: bool = True) -> tuple[nn.Module, torch.optim.Optimizer]:
    """An MLP whose weights and Adam state together take about ``mib`` MiB, after one optimizer step."""
    layer_mib = 3 * (WIDTH * WIDTH + WIDTH) * 4 / MiB
    depth = max(1, round(mib / layer_mib))
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(WIDTH, WIDTH) for _ in range(depth)])
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    if step:
        _step(model, optimizer)
    return model, optimizer


def _step(model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    for parameter in model.parameters():
        parameter.grad = torch.full_like(parameter, 1e-3)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def _state_tensors(model: nn.Module, optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    return list(model.state_dict().values()) + [
        v for s in optimizer.state.values() for v in s.values() if isinstance(v, torch.Tensor)
    ]


def state_mib(model: nn.Module, optimizer: torch.optim.Optimizer) -> float:
    return sum(t.numel() * t.element_size() for t in _state_tensors(model, optimizer)) / MiB


def _forks(root: str) -> bool:
    from drivetrain._utilities import paths
    from drivetrain.plugins.io.forked import platform_supports_fork

    return platform_supports_fork() and not paths.is_remote(root)


def timed(function: Callable[[], Any]) -> float:
    start = time.perf_counter()
    function()
    return time.perf_counter() - start


# -- one process: local disk or S3 ------------------------------------------------------------------
def single_process(root: str, mib: int, rounds: int, *, async_stall: bool) -> dict[str, list[float]]:
    import fsspec

    import drivetrain as dt
    from drivetrain._utilities import paths
    from drivetrain.plugins.io import AsyncCheckpointIO
    from drivetrain.plugins.io.atomic import remove
    from drivetrain.strategies.checkpointing import (
        TrainingObjects,
        checkpoint_entries,
        read_checkpoint,
        write_checkpoint,
    )

    model, optimizer = build(mib)
    objects = TrainingObjects(models=[model], optimizers=[optimizer])
    strategy = dt.connect(accelerator="cpu")
    background = AsyncCheckpointIO()
    async_strategy = dt.connect(accelerator="cpu", plugins=[background])
    forking = AsyncCheckpointIO(snapshot="fork") if _forks(root) else None
    fork_strategy = dt.connect(accelerator="cpu", plugins=[forking]) if forking is not None else None
    ours, plain = paths.join(root, "drivetrain.ckpt"), paths.join(root, "torch.ckpt")

    def drivetrain_save() -> None:
        write_checkpoint(strategy, ours, checkpoint_entries(strategy, objects, door="trainer"))

    def torch_save() -> None:
        state = {"state_dict": model.state_dict(), "optimizer_0": optimizer.state_dict()}
        if paths.is_remote(plain):
            with fsspec.open(plain, "wb") as file:
                torch.save(state, file)
        else:
            torch.save(state, plain)

    def durable_torch_save() -> None:
        # What a crash-safe write cannot skip: the bytes on disk before the checkpoint counts as written.
        with open(plain, "wb") as file:
            torch.save({"state_dict": model.state_dict(), "optimizer_0": optimizer.state_dict()}, file)
            file.flush()
            os.fsync(file.fileno())

    def drivetrain_load() -> None:
        read_checkpoint(strategy, ours, objects)

    def torch_load() -> None:
        if paths.is_remote(plain):
            with fsspec.open(plain, "rb") as file:
                loaded = torch.load(file, weights_only=True)
        else:
            loaded = torch.load(plain, weights_only=True)
        model.load_state_dict(loaded["state_dict"])
        optimizer.load_state_dict(loaded["optimizer_0"])

    # The floor of any stall that snapshots before returning: the state copied into memory already mapped.
    live = _state_tensors(model, optimizer)
    spare = [torch.empty_like(tensor) for tensor in live]

    def copy_state() -> None:
        for target, tensor in zip(spare, live, strict=True):
            target.copy_(tensor)

    def update_state() -> (
        None
    ):  # writes every page of the state, values unchanged (an optimizer step's writes)
        with torch.no_grad():
            for tensor in live:
                tensor.mul_(1.0)

    def background_save(with_strategy: Any) -> float:
        return timed(
            lambda: write_checkpoint(
                with_strategy, ours, checkpoint_entries(with_strategy, objects, door="trainer")
            )
        )

    names = (
        "save",
        "torch_save",
        "torch_save_fsync",
        "load",
        "torch_load",
        "stall",
        "stall_fork",
        "copy",
        "update",
        "update_after_save",
    )
    times: dict[str, list[float]] = {k: [] for k in names}
    for round_ in range(rounds + 1):  # round 0 warms caches and is dropped
        pairs = [("save", drivetrain_save), ("torch_save", torch_save)]
        if not paths.is_remote(root):
            pairs.append(("torch_save_fsync", durable_torch_save))
        loads = [("load", drivetrain_load), ("torch_load", torch_load)]
        if round_ % 2:
            pairs.reverse()
            loads.reverse()
        measured = {name: timed(function) for name, function in pairs + loads}
        if async_stall:
            measured["copy"] = timed(copy_state)
            measured["stall"] = background_save(async_strategy)
            # Wait for the background write (untimed) and delete it; no teardown(), which would free
            # the staging memory a run keeps from save to save (round 0, dropped, allocates it).
            background.remove_checkpoint(ours)
            if forking is not None:
                measured["update"] = timed(update_state)
                measured["stall_fork"] = background_save(fork_strategy)
                measured["update_after_save"] = timed(update_state)  # while the child writes
                forking.remove_checkpoint(ours)
        for path in (ours, plain):
            remove(path)
        print(
            f"{root}: round {round_}: " + ", ".join(f"{k} {v:.2f}s" for k, v in measured.items()), flush=True
        )
        if round_:
            for name, value in measured.items():
                times[name].append(value)
    background.teardown()
    if forking is not None:
        forking.teardown()
    times["state_mib"] = [state_mib(model, optimizer)]
    return times


# -- two processes: FSDP sharded -------------------------------------------------------------------
def _sharded_rank(strategy: Any, root: str, mib: int, rounds: int) -> dict[str, Any]:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_optimizer_state_dict,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    from drivetrain._utilities import paths
    from drivetrain.plugins.io.atomic import remove
    from drivetrain.plugins.io.dcp import storage_reader, storage_writer

    strategy.setup_environment()
    torch.set_num_threads(1)
    model, optimizer = build(mib, step=False)
    model, [optimizer] = strategy.setup_module_and_optimizers(model, [optimizer])
    _step(model, optimizer)
    ours, plain = paths.join(root, "drivetrain-sharded"), paths.join(root, "dcp-sharded")

    def drivetrain_save() -> None:
        strategy.save_state(ours, {"model": model, "optimizer": optimizer})

    def dcp_save() -> None:
        state = {
            "model": get_model_state_dict(model),
            "optimizer": get_optimizer_state_dict(model, optimizer),
        }
        dcp.save(state, storage_writer=storage_writer(plain))

    def drivetrain_load() -> None:
        strategy.load_state(ours, {"model": model, "optimizer": optimizer})

    def dcp_load() -> None:
        state: dict[str, Any] = {
            "model": get_model_state_dict(model),
            "optimizer": get_optimizer_state_dict(model, optimizer),
        }
        dcp.load(state, storage_reader=storage_reader(plain, weights_only=False))
        set_model_state_dict(model, state["model"])
        set_optimizer_state_dict(model, optimizer, state["optimizer"])

    def clock(function: Callable[[], None]) -> float:
        strategy.barrier("bench")
        start = time.perf_counter()
        function()
        strategy.barrier("bench")
        return time.perf_counter() - start

    times: dict[str, list[float]] = {k: [] for k in ("save", "dcp_save", "load", "dcp_load")}
    for round_ in range(rounds + 1):
        order = [
            ("save", drivetrain_save),
            ("dcp_save", dcp_save),
            ("load", drivetrain_load),
            ("dcp_load", dcp_load),
        ]
        if round_ % 2:
            order = [order[1], order[0], order[3], order[2]]
        measured = {name: clock(function) for name, function in order}
        if strategy.is_global_zero:
            for path in (ours, plain):
                remove(path)
                paths.remove_tree(path)
        strategy.barrier("bench-clean")
        if strategy.is_global_zero:
            print(
                f"{root} (2 ranks): round {round_}: "
                + ", ".join(f"{k} {v:.2f}s" for k, v in measured.items()),
                flush=True,
            )
        if round_:
            for name, value in measured.items():
                times[name].append(value)
    return times


def sharded(root: str, mib: int, rounds: int) -> dict[str, list[float]]:
    import drivetrain as dt
    from drivetrain.strategies import FSDPStrategy

    strategy = dt.connect(
        accelerator="cpu", strategy=FSDPStrategy(start_method="fork", auto_wrap_policy={nn.Linear}), devices=2
    )
    launcher = strategy.launcher
    assert launcher is not None  # FSDPStrategy(start_method="fork") starts its processes
    result: dict[str, list[float]] = launcher.launch(_sharded_rank, strategy, root, mib, rounds)
    return result


# -- the local S3 server ----------------------------------------------------------------------------
_SERVER = """
import logging, sys
from moto.server import ThreadedMotoServer
logging.getLogger("werkzeug").setLevel(logging.ERROR)
server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
server.start()
print(server.get_host_and_port()[1], flush=True)
sys.stdin.read()
server.stop()
"""


@contextlib.contextmanager
def s3_bucket() -> Iterator[str]:
    """A bucket on a moto server started for this run; AWS's environment variables point at it."""
    server = subprocess.Popen(
        [sys.executable, "-c", _SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert server.stdout is not None
        port = server.stdout.readline().strip()
        os.environ.update(
            AWS_ACCESS_KEY_ID="bench",
            AWS_SECRET_ACCESS_KEY="bench",
            AWS_DEFAULT_REGION="us-east-1",
            AWS_ENDPOINT_URL=f"http://127.0.0.1:{port}",
        )
        import s3fs

        bucket = f"bench-{uuid.uuid4().hex[:8]}"
        s3fs.S3FileSystem().mkdir(bucket)
        yield f"s3://{bucket}"
    finally:
        for stream in (server.stdin, server.stdout):
            if stream is not None:
                stream.close()
        server.wait(timeout=30)


# -- report -----------------------------------------------------------------------------------------
def ratio(
    key: str, label: str, values: list[float], reference: list[float], unit: str, limit: float | None = None
) -> Measurement:
    return Measurement(key, label, Scale.RATIO, unit, [paired_log_ratios(values, reference)], limit)


def measurements(
    where: str, times: dict[str, list[float]], sharded_times: dict[str, list[float]] | None
) -> list[Measurement]:
    found = [
        ratio(
            f"{where}/save",
            f"{where}: drivetrain save / torch.save",
            times["save"],
            times["torch_save"],
            "× torch.save",
            1.1 if where == "local" else None,
        ),
        ratio(
            f"{where}/load",
            f"{where}: drivetrain load / torch.load + load_state_dict",
            times["load"],
            times["torch_load"],
            "× torch.load",
        ),
    ]
    if times.get("torch_save_fsync"):
        found.insert(
            1,
            ratio(
                f"{where}/save_vs_fsync",
                f"{where}: drivetrain save / torch.save + fsync",
                times["save"],
                times["torch_save_fsync"],
                "× torch.save + fsync",
            ),
        )
    if times.get("stall"):
        found.append(
            ratio(
                f"{where}/async_stall",
                f"{where}: asynchronous save (default, snapshot='copy'), loop stall / synchronous save",
                times["stall"],
                times["save"],
                "× sync save",
                0.05,
            )
        )
    if times.get("stall_fork"):
        found += [
            ratio(
                f"{where}/async_stall_fork",
                f"{where}: asynchronous save (snapshot='fork'), loop stall / synchronous save",
                times["stall_fork"],
                times["save"],
                "× sync save",
            ),
            ratio(
                f"{where}/update_after_fork",
                f"{where}: in-place update of the state right after a forked save (copy-on-write) / the same update alone",
                times["update_after_save"],
                times["update"],
                "× update",
            ),
        ]
    if times.get("copy"):
        found += [
            ratio(
                f"{where}/stall_vs_copy",
                f"{where}: asynchronous save, loop stall / copy_ of the state into allocated memory",
                times["stall"],
                times["copy"],
                "× copy_",
            ),
            ratio(
                f"{where}/copy_vs_save",
                f"{where}: copy_ of the state into allocated memory / synchronous save (the stall's floor)",
                times["copy"],
                times["save"],
                "× sync save",
            ),
        ]
    if sharded_times is not None:
        found += [
            ratio(
                f"{where}/sharded_save",
                f"{where}, 2 ranks FSDP: drivetrain save_state / dcp.save",
                sharded_times["save"],
                sharded_times["dcp_save"],
                "× dcp.save",
            ),
            ratio(
                f"{where}/sharded_load",
                f"{where}, 2 ranks FSDP: drivetrain load_state / dcp.load",
                sharded_times["load"],
                sharded_times["dcp_load"],
                "× dcp.load",
            ),
        ]
    return found


def fmt(measurement: Measurement) -> str:
    interval = measurement.interval
    if interval is None:
        return "not measured"
    estimate = f"{interval.estimate:.3f}"
    if interval.low is None or interval.high is None:
        return estimate
    return f"{estimate} [{interval.low:.3f}, {interval.high:.3f}]"


def median_row(label: str, times: dict[str, list[float]], names: list[str]) -> str:
    cells = [f"{statistics.median(times[n]):.3f}" if times.get(n) else "-" for n in names]
    return f"| {label} | " + " | ".join(cells) + " |"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mib", type=int, default=1024, help="training state on local disk (MiB)")
    parser.add_argument("--s3-mib", type=int, default=256, help="training state on the local S3 server (MiB)")
    parser.add_argument(
        "--sharded-mib", type=int, default=512, help="state of the 2-rank sharded case (MiB, all ranks)"
    )
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--no-s3", action="store_true")
    parser.add_argument("--no-local", action="store_true", help="only the S3 cases")
    parser.add_argument("--output", type=Path, default=RESULTS / "checkpoint-speed.md")
    parser.add_argument(
        "--render",
        type=Path,
        metavar="JSON",
        help="only write the report again from a run's JSON (its times)",
    )
    args = parser.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    command = " ".join(argv if argv is not None else sys.argv[1:])
    if args.render is not None:
        saved = json.loads(args.render.read_text())
        for name, value in saved.get("args", {}).items():  # the sizes and rounds the run used
            setattr(args, name, value)
        loads = {key: _load(value) for key, value in saved["load"].items()}
        rendered = {where: (value["single"], value["sharded"]) for where, value in saved["times"].items()}
        return report(args, saved.get("command", command), rendered, loads["before"], loads["after"])

    before = probe()
    folder = tempfile.mkdtemp(prefix="drivetrain-ckpt-bench-", dir=os.environ.get("BENCH_DIR"))
    try:
        results: dict[str, Any] = {}
        if not args.no_local:
            local = single_process(folder, args.mib, args.rounds, async_stall=True)
            results["local"] = (local, sharded(folder, args.sharded_mib, args.rounds))
        if not args.no_s3:
            with s3_bucket() as bucket:
                remote = single_process(bucket, args.s3_mib, args.rounds, async_stall=False)
                remote_sharded = sharded(bucket, min(args.sharded_mib, args.s3_mib), args.rounds)
            results["s3"] = (remote, remote_sharded)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    after = probe()
    return report(args, command, results, before, after)


def _load(saved: dict[str, Any]) -> Load:
    average = saved.get("load_average")
    return Load(tuple(average) if average else None, saved.get("runnable"), saved.get("busy"), saved["cores"])


def report(args: argparse.Namespace, command: str, results: dict[str, Any], before: Load, after: Load) -> int:
    """Write the Markdown and JSON reports of ``results`` (times per place, one process and two)."""
    local = results["local"][0] if "local" in results else {"state_mib": [0.0]}
    found = [m for where, (one, two) in results.items() for m in measurements(where, one, two)]
    lines = [
        "# Checkpoint speed: drivetrain against plain torch.save / torch.load / DCP",
        "",
        f"Produced by `python -m benchmarks.checkpoint_speed {command}`"
        f" on {platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, Python {platform.python_version()}.",
        f"Training state: an MLP of Linear({WIDTH}, {WIDTH}) layers with its Adam state, "
        f"{local['state_mib'][0]:.0f} MiB on local disk"
        + (
            f", {results['s3'][0]['state_mib'][0]:.0f} MiB on the local S3 server (moto, 127.0.0.1, s3fs)"
            if "s3" in results
            else ""
        )
        + f"; the 2-rank FSDP case holds {args.sharded_mib} MiB over both ranks"
        + (f" ({min(args.sharded_mib, args.s3_mib)} MiB on S3)" if "s3" in results else "")
        + f". {args.rounds} paired rounds after one warm-up round, order alternating; ratios are 20 % trimmed means "
        "of the per-round ratios with 95 % bootstrap intervals.",
        "",
        f"**Machine load**: before {before.describe()}; after {after.describe()}. "
        + (
            "This machine was shared with other agents' builds and test runs while this ran: absolute times "
            "are noise, the paired ratios less so; rerun on a quiet machine for decisions."
            if before.too_busy or after.too_busy
            else "The machine was quiet."
        ),
        "",
        "| measurement | ratio [95 % interval] | target | decision |",
        "|---|---|---|---|",
    ]
    for m in found:
        target = "-" if m.limit is None else f"<= {m.limit:g}"
        decision = "-" if m.decision is None else m.decision.value
        lines.append(f"| {m.label} | {fmt(m)} | {target} | {decision} |")
    lines += [
        "",
        "Median seconds per operation:",
        "",
        "| where | drivetrain save | torch.save | torch.save + fsync | drivetrain load | torch.load | async stall "
        "| async stall (fork) | copy_ of the state | update | update after forked save |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for where, (one, _) in results.items():
        lines.append(
            median_row(
                where,
                one,
                [
                    "save",
                    "torch_save",
                    "torch_save_fsync",
                    "load",
                    "torch_load",
                    "stall",
                    "stall_fork",
                    "copy",
                    "update",
                    "update_after_save",
                ],
            )
        )
    lines += [
        "",
        "| where (2 ranks, FSDP) | drivetrain save_state | dcp.save | drivetrain load_state | dcp.load |",
        "|---|---:|---:|---:|---:|",
    ]
    for where, (_, two) in results.items():
        lines.append(median_row(where, two or {}, ["save", "dcp_save", "load", "dcp_load"]))
    lines += [
        "",
        "What the drivetrain numbers include that the plain ones do not: the checkpoint's core entries "
        "(format metadata, every process's generators gathered), a temporary file or key, fsync (write-back is "
        "started while the file is written, so it waits for the tail), reading the "
        "archive's index back to verify it, and the atomic publish (rename locally; a server-side copy on S3); "
        "on load, safe unpickling and the checks of counts and metadata. The sharded save also stages, verifies "
        "and publishes the folder (a completion marker on S3).",
    ]
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text("\n".join(lines) + "\n")
    payload = {
        "command": command,
        "args": {name: getattr(args, name) for name in ("mib", "s3_mib", "sharded_mib", "rounds")},
        "measurements": [m.as_dict() for m in found],
        "times": {where: {"single": one, "sharded": two} for where, (one, two) in results.items()},
        "load": {"before": before.as_dict(), "after": after.as_dict()},
    }
    args.output.with_suffix(".json").write_text(json.dumps(payload, indent=1, default=str))
    print("\n".join(lines))
    return 0 if all(not math.isnan(m.interval.estimate) for m in found if m.interval is not None) else 1


if __name__ == "__main__":
    raise SystemExit(main())
