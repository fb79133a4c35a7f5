"""Run a function in several processes under torch's elastic agent (``torch.distributed.launcher``).

What ``notebook_launcher`` uses when it is given Accelerate's elastic options (``rdzv_backend="c10d"``,
``max_restarts``, ``monitor_interval`` …): torch's own agent forks the processes, runs the
rendezvous, watches them every ``monitor_interval`` seconds and restarts them all up to
``max_restarts`` times. drivetrain adds no transport of its own.
"""

from __future__ import annotations

import functools
import os
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

#: The signals torch's agent takes over (its default TORCHELASTIC_SIGNALS_TO_HANDLE).
_AGENT_SIGNALS = ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT")


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
    with _handlers_left_as_found():
        results: dict[int, Any] = elastic_launch(config=config, entrypoint=_with_fresh_signals(function))(
            *args
        )
    return results


def _with_fresh_signals(function: Callable[..., Any]) -> Callable[..., Any]:
    """``function`` run with the signal handlers a newly started process has, not the agent's.

    The agent forks its workers after installing its own handlers. A worker that inherited them
    turned the agent's SIGTERM into a Python exception that waits for the interpreter, so a worker
    blocked in the rendezvous or a collective (a peer had failed) ignored it and was killed only
    after torch's 30-second grace: every restart and every failed launch waited 30 s.
    """

    @functools.wraps(function)
    def worker(*args: Any, **kwargs: Any) -> Any:
        for name in _AGENT_SIGNALS:
            if hasattr(signal, name):
                signum = getattr(signal, name)
                signal.signal(
                    signum, signal.default_int_handler if signum == signal.SIGINT else signal.SIG_DFL
                )
        return function(*args, **kwargs)

    return worker


@contextmanager
def _handlers_left_as_found() -> Iterator[None]:
    """Put back the signal handlers (and the variable naming them) torch's agent installs and leaves.

    Left in place, the next Ctrl-C or kernel interrupt in the notebook raised torch's
    ``SignalException`` instead of ``KeyboardInterrupt``, and a SIGTERM meant for a later fit was
    turned into that exception by torch's handler.
    """
    signals = [getattr(signal, name) for name in _AGENT_SIGNALS if hasattr(signal, name)]
    handlers = {signum: signal.getsignal(signum) for signum in signals}
    variable = os.environ.get("TORCHELASTIC_SIGNALS_TO_HANDLE")
    try:
        yield
    finally:
        if threading.current_thread() is threading.main_thread():
            for signum, handler in handlers.items():
                if handler is not None:  # None: installed outside Python, cannot be put back
                    signal.signal(signum, handler)
        if variable is None:
            os.environ.pop("TORCHELASTIC_SIGNALS_TO_HANDLE", None)
        else:
            os.environ["TORCHELASTIC_SIGNALS_TO_HANDLE"] = variable
