"""Run a function in several processes under torch's elastic agent (``torch.distributed.launcher``).

What ``notebook_launcher`` uses when it is given Accelerate's elastic options (``rdzv_backend="c10d"``,
``max_restarts``, ``monitor_interval`` …): torch's own agent forks the processes, runs the
rendezvous, watches them every ``monitor_interval`` seconds and restarts them all up to
``max_restarts`` times. drivetrain adds no transport of its own.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def run_elastic(
    function: Callable[..., Any],
    args: tuple[Any, ...],
    *,
    nproc_per_node: int,
    num_nodes: int,
    node_rank: int,
    rdzv_backend: str,
    rdzv_endpoint: str,
    rdzv_configs: dict[str, Any],
    rdzv_id: str,
    max_restarts: int,
    monitor_interval: float,
    log_line_prefix_template: str | None = None,
) -> dict[int, Any]:
    """``function(*args)`` on ``nproc_per_node`` forked processes of this node; returns each local rank's result.

    Raises:
        torch.distributed.elastic.multiprocessing.errors.ChildFailedError: a process failed after
            ``max_restarts`` restarts; it names the rank and its error.
    """
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    configs = dict(rdzv_configs)
    if rdzv_backend == "static":
        configs["rank"] = node_rank  # the static rendezvous is told this node's place
    config = LaunchConfig(
        min_nodes=num_nodes,
        max_nodes=num_nodes,
        nproc_per_node=nproc_per_node,
        run_id=rdzv_id,
        rdzv_endpoint=rdzv_endpoint,
        rdzv_backend=rdzv_backend,
        rdzv_configs=configs,
        max_restarts=max_restarts,
        monitor_interval=monitor_interval,
        start_method="fork",
        log_line_prefix_template=log_line_prefix_template,
    )
    results: dict[int, Any] = elastic_launch(config=config, entrypoint=function)(*args)
    return results
