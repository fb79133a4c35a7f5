"""What every benchmark script shares, so that the variants differ only in the framework.

The scripts run in two interpreters (the project's ``.venv`` for raw PyTorch and drivetrain, the
peers' venv for Lightning, Fabric and Accelerate), so this module needs nothing beyond the standard
library and torch. The harness hands each script its settings as JSON in ``BENCH_CONFIG`` and the
wall-clock time at which it started the command in ``BENCH_T0``; the script answers with one line
``BENCH_RESULT {json}`` on stdout.

Timing is the same for every variant: a global optimizer step post-hook (public torch API) records
``time.perf_counter()`` each time *any* optimizer finishes a step, whichever framework called it.
The per-step time is the mean interval between step ends after the warm-up steps, so it includes
everything a framework does between two steps (data loading, hooks, logging), and the first
timestamp gives command-to-first-step.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import resource
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn
from torch.optim.optimizer import register_optimizer_step_post_hook
from torch.utils.data import DataLoader, Sampler, TensorDataset

CONFIG_VARIABLE = "BENCH_CONFIG"
START_VARIABLE = "BENCH_T0"
RESULT_PREFIX = "BENCH_RESULT "

# name -> (inputs, hidden width, hidden layers). "tiny" is overhead-bound: a step is a few hundred
# microseconds, so anything a framework adds per step shows. "wide" is compute-bound: tens of
# milliseconds of matrix products per step. "ddp" sits between: real compute plus an all-reduce.
MODELS = {
    "tiny": (32, 64, 1),
    "wide": (256, 2048, 2),
    "ddp": (64, 512, 2),
}


def load_config() -> dict[str, Any]:
    """The settings the harness passed in ``BENCH_CONFIG`` (model, steps, batch size, seed, lr)."""
    raw = os.environ.get(CONFIG_VARIABLE)
    if raw is None:
        raise SystemExit(f"{sys.argv[0]}: run me through `python -m benchmarks` ({CONFIG_VARIABLE} is unset)")
    config = json.loads(raw)
    config["total_steps"] = config["warmup_steps"] + config["timed_steps"]
    return config


def build_model(config: dict[str, Any]) -> nn.Module:
    """The benchmark MLP, initialised from ``config["seed"]`` (identical in every variant)."""
    inputs, width, depth = MODELS[config["model"]]
    torch.manual_seed(config["seed"])
    layers: list[nn.Module] = [nn.Linear(inputs, width), nn.ReLU()]
    for _ in range(depth - 1):
        layers += [nn.Linear(width, width), nn.ReLU()]
    layers.append(nn.Linear(width, 1))
    return nn.Sequential(*layers)


def build_dataset(config: dict[str, Any]) -> TensorDataset:
    """Exactly ``total_steps`` global batches of a smooth regression problem, from a fixed seed."""
    inputs = MODELS[config["model"]][0]
    world_size = config.get("world_size", 1)
    rows = config["total_steps"] * config["batch_size"] * world_size
    generator = torch.Generator().manual_seed(config["seed"] + 1)
    features = torch.randn(rows, inputs, generator=generator)
    targets = torch.sin(features.sum(dim=1, keepdim=True) / math.sqrt(inputs))
    return TensorDataset(features, targets)


def build_loader(
    config: dict[str, Any], dataset: TensorDataset | None = None, sampler: Sampler | None = None
) -> DataLoader:
    """The one DataLoader setting every variant uses: in order, no workers, full batches.

    ``shuffle=False`` keeps the comparison exact under DDP: Lightning/drivetrain shard by sample
    (``DistributedSampler``) and Accelerate by batch, and only without shuffling do both give every
    global step the same set of rows.
    """
    dataset = build_dataset(config) if dataset is None else dataset
    return DataLoader(
        dataset,
        batch_size=config["batch_size"],
        shuffle=False,
        sampler=sampler,
        num_workers=0,
        drop_last=True,
    )


def build_optimizer(model: nn.Module, config: dict[str, Any]) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=config["lr"])


def loss_fn(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return nn.functional.mse_loss(output, target)


@torch.no_grad()
def final_loss(model: nn.Module, config: dict[str, Any]) -> float:
    """Loss of the trained weights on a fixed slice of the data: equal weights give equal values."""
    features, targets = build_dataset(config)[:512]
    model = model.to("cpu")
    return float(loss_fn(model(features), targets))


class StepClock:
    """Timestamps the end of every optimizer step in this process, whoever calls ``step()``."""

    def __init__(self, synchronize: Callable[[], None] | None = None, sync_steps: Sequence[int] = ()) -> None:
        """Start recording.

        Args:
            synchronize: waits for the device (``torch.cuda.synchronize``). On a GPU the host runs
                ahead of the kernels, so the stamps that bound a timed window must wait for them.
            sync_steps: the 0-based steps whose stamps wait for the device: the first one (the
                first step really done) and the two ends of the timed window. Every other step
                is stamped without waiting, so host/device overlap is kept.
        """
        self.start_wall = float(os.environ.get(START_VARIABLE, "nan"))
        # One (wall, perf_counter) pair converts later perf_counter stamps to wall time, so the
        # hook itself stays one list append for every framework.
        self._wall_origin = time.time()
        self._perf_origin = time.perf_counter()
        self.times: list[float] = []
        self._synchronize = synchronize
        self._sync_steps = frozenset(sync_steps)
        hook = self._record if synchronize is None else self._record_synchronized
        self._handle = register_optimizer_step_post_hook(hook)

    def _record(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self.times.append(time.perf_counter())

    def _record_synchronized(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if len(self.times) in self._sync_steps:
            assert self._synchronize is not None
            self._synchronize()
        self.times.append(time.perf_counter())

    def summary(self, warmup_steps: int) -> dict[str, Any]:
        """Step count, mean/median step time after ``warmup_steps``, command-to-first-step."""
        times = self.times
        timed = times[warmup_steps - 1 :] if warmup_steps > 0 else times
        intervals = sorted(b - a for a, b in itertools.pairwise(timed))
        result: dict[str, Any] = {"steps": len(times)}
        if intervals:
            result["step_s"] = (timed[-1] - timed[0]) / len(intervals)
            result["step_median_s"] = intervals[len(intervals) // 2]
        if times and not math.isnan(self.start_wall):
            result["first_step_s"] = self._wall_origin + (times[0] - self._perf_origin) - self.start_wall
        return result


def max_rss_mib() -> float:
    """Peak resident memory of this process (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def report(
    config: dict[str, Any], clock: StepClock, model: nn.Module | None, rank: int = 0, **extra: Any
) -> None:
    """Print the one result line the harness reads (rank 0 only; the others stay silent)."""
    if rank != 0:
        return
    result = clock.summary(config["warmup_steps"])
    if model is not None:
        result["final_loss"] = final_loss(model, config)
    result.update(
        max_rss_mib=max_rss_mib(),
        torch=torch.__version__,
        python=".".join(map(str, sys.version_info[:3])),
        threads=torch.get_num_threads(),
        drivetrain_file=drivetrain_file(),
        **extra,
    )
    print(RESULT_PREFIX + json.dumps(result), flush=True)


def drivetrain_file() -> str | None:
    """Where the ``drivetrain`` this process imported lives (None if it imported none).

    The harness checks it against the source tree the variant was meant to measure.
    """
    module = sys.modules.get("drivetrain")
    return getattr(module, "__file__", None)
