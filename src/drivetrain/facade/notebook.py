"""``notebook_launcher`` and ``debug_launcher``: run a training function in several processes from Python.

For code typed into a notebook or an interactive session, which cannot be re-run as a script:
the function (which builds its own ``drivetrain.Accelerator``) runs in forked processes, each
given torchrun's variables (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` …), so the
Accelerator joins them as it would under ``drivetrain launch``. One process runs the function
here. If a process fails, the others are stopped and the error names it.
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Callable
from typing import Any

from drivetrain.strategies.launchers.store import host_store, store_address
from drivetrain.utils.environment import patch_environment

_MIXED_PRECISION = ("no", "fp16", "bf16")
#: Accelerate's elastic options at their defaults, which ask for nothing (a migrated call may spell them out).
_NEUTRAL_ELASTIC: dict[str, tuple[Any, ...]] = {
    "rdzv_backend": ("static",),
    "rdzv_endpoint": ("",),
    "rdzv_conf": (None, {}),
    "rdzv_id": ("none",),
    "max_restarts": (0,),
    "monitor_interval": (0.1,),
    "log_line_prefix_template": (None,),
}


def notebook_launcher(
    function: Callable[..., Any],
    args: tuple[Any, ...] = (),
    num_processes: int | None = None,
    mixed_precision: str = "no",
    use_port: str | int | None = None,
    master_addr: str = "127.0.0.1",
    node_rank: int = 0,
    num_nodes: int = 1,
    **elastic: Any,
) -> None:
    """Run ``function(*args)`` in ``num_processes`` processes on this machine (of ``num_nodes``).

    Args:
        function: the training function; it builds the ``drivetrain.Accelerator``.
        args: its arguments.
        num_processes: processes on this machine (default 1: the function runs here).
        mixed_precision: ``"no"``, ``"fp16"`` or ``"bf16"``: the default of the Accelerators the
            function builds (``ACCELERATE_MIXED_PRECISION``).
        use_port: the rendezvous port on ``master_addr`` (default: a free one, single machine).
        master_addr: where rank 0 is, for several machines each running this launcher.
        node_rank: this machine's place among them.
        num_nodes: how many machines there are.
        **elastic: Accelerate's elastic options, as it passes them to torch's elastic launcher:
            ``rdzv_backend`` (``"static"``, ``"c10d"`` …), ``rdzv_endpoint``, ``rdzv_conf``,
            ``rdzv_id``, ``max_restarts``, ``monitor_interval``, ``log_line_prefix_template``. At
            their defaults the processes are forked directly (the rendezvous on a port this
            process holds); any other value runs them under torch's elastic agent
            (``torch.distributed.launcher.api.elastic_launch``), which restarts them
            ``max_restarts`` times.

    Raises:
        ValueError: a bad setting; the first failing process's error (torch's
            ``ProcessRaisedException``/``ProcessExitedException`` naming it).
    """
    if not callable(function):
        raise TypeError(
            f"notebook_launcher(function, ...) needs the training function itself, got {type(function).__name__} "
            f"({function!r}). Pass the function object: notebook_launcher(train, args=(...,), num_processes=2)."
        )
    if not isinstance(args, (tuple, list)):
        raise TypeError(
            f"notebook_launcher(args=...) takes the function's arguments as a tuple, got {type(args).__name__} "
            f"({args!r}). For one argument write args=({args!r},)."
        )
    unknown = sorted(set(elastic) - set(_NEUTRAL_ELASTIC))
    if unknown:
        raise TypeError(
            f"notebook_launcher() got unexpected arguments {unknown}; its elastic options are "
            f"{', '.join(_NEUTRAL_ELASTIC)}."
        )
    asked = {name: value for name, value in elastic.items() if value not in _NEUTRAL_ELASTIC[name]}
    if mixed_precision not in _MIXED_PRECISION:
        raise ValueError(
            f"mixed_precision={mixed_precision!r} is not supported; use one of {', '.join(map(repr, _MIXED_PRECISION))}."
        )
    processes = 1 if num_processes is None else num_processes
    for name, value, least in (
        ("num_processes", processes, 1),
        ("num_nodes", num_nodes, 1),
        ("node_rank", node_rank, 0),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise ValueError(f"{name} must be an int >= {least}, got {value!r}.")
    if node_rank >= num_nodes:
        raise ValueError(f"node_rank={node_rank} must be below num_nodes={num_nodes}.")
    if processes == 1 and num_nodes == 1:
        variables = {} if mixed_precision == "no" else {"ACCELERATE_MIXED_PRECISION": mixed_precision}
        with patch_environment(**variables):
            function(*args)
        return
    if asked:
        _elastic_launch(
            function, args, processes, num_nodes, node_rank, master_addr, use_port, mixed_precision, elastic
        )
        return
    if use_port is None and num_nodes > 1:
        raise ValueError("Several machines need a rendezvous port they agree on: pass use_port=...")
    port = _port(use_port)
    world_size = processes * num_nodes
    layout = {
        "MASTER_ADDR": master_addr,
        "WORLD_SIZE": str(world_size),
        "LOCAL_WORLD_SIZE": str(processes),
        "NODE_RANK": str(node_rank),
        "ACCELERATE_MIXED_PRECISION": mixed_precision,
    }
    import torch.multiprocessing as mp

    store = None
    if node_rank == 0:
        # This process hosts the rendezvous store before any rank starts, bound in one step (port 0:
        # the system's choice), so no other program can take the port between choosing and binding.
        # Every rank, rank 0 included, joins it as torchrun's ranks join their agent's store.
        spans_nodes = num_nodes > 1
        try:
            store = host_store(
                master_addr, port, world_size, datetime.timedelta(minutes=30), spans_nodes=spans_nodes
            )
        except (RuntimeError, OSError):  # only a port the user chose can be taken
            raise ValueError(
                f"notebook_launcher(use_port={use_port!r}) cannot listen on port {port} for the rendezvous: "
                f"another program holds it (or it is not allowed). Pass a free port, or leave use_port out "
                f"(one machine) to let the system choose one."
            ) from None
        port = store.port
        layout["MASTER_ADDR"] = store_address(master_addr, spans_nodes=spans_nodes)
        layout["TORCHELASTIC_USE_AGENT_STORE"] = "True"
    layout["MASTER_PORT"] = str(port)
    mp.start_processes(
        _run_process,
        args=(function, args, layout, processes * node_rank),
        nprocs=processes,
        join=True,
        start_method="fork",
    )
    del store  # hosted until every process here has ended


def _elastic_launch(
    function: Callable[..., Any],
    args: tuple[Any, ...],
    processes: int,
    num_nodes: int,
    node_rank: int,
    master_addr: str,
    use_port: str | int | None,
    mixed_precision: str,
    elastic: dict[str, Any],
) -> None:
    """Check Accelerate's elastic options and run the processes under torch's elastic agent."""
    from drivetrain.strategies.launchers.elastic_function import run_elastic

    settings = {name: elastic.get(name, defaults[0]) for name, defaults in _NEUTRAL_ELASTIC.items()}
    restarts = settings["max_restarts"]
    if isinstance(restarts, bool) or not isinstance(restarts, int) or restarts < 0:
        raise ValueError(f"max_restarts must be an int >= 0, got {restarts!r}.")
    interval = settings["monitor_interval"]
    if isinstance(interval, bool) or not isinstance(interval, (int, float)) or interval <= 0:
        raise ValueError(f"monitor_interval must be a positive number of seconds, got {interval!r}.")
    endpoint = settings["rdzv_endpoint"]
    if not endpoint:
        if use_port is None and num_nodes > 1:
            raise ValueError("Several machines need a rendezvous port they agree on: pass use_port=...")
        # One machine without a port: the rendezvous store takes a free one (port 0), as torchrun --standalone.
        endpoint = f"{master_addr}:{_port(use_port)}"
    with patch_environment(ACCELERATE_MIXED_PRECISION=mixed_precision):
        run_elastic(
            function,
            args,
            nproc_per_node=processes,
            num_nodes=num_nodes,
            node_rank=node_rank,
            rdzv_backend=str(settings["rdzv_backend"]),
            rdzv_endpoint=endpoint,
            rdzv_configs=dict(settings["rdzv_conf"] or {}),
            rdzv_id=str(settings["rdzv_id"]),
            max_restarts=restarts,
            monitor_interval=float(interval),
            log_line_prefix_template=settings["log_line_prefix_template"],
        )


def debug_launcher(function: Callable[..., Any], args: tuple[Any, ...] = (), num_processes: int = 2) -> None:
    """Run ``function(*args)`` in ``num_processes`` CPU processes on this machine (to debug multi-process code).

    The Accelerators the function builds run on the CPU (``ACCELERATE_USE_CPU``).
    """
    with patch_environment(ACCELERATE_USE_CPU="1"):
        notebook_launcher(function, args, num_processes=num_processes)


def _run_process(
    local_rank: int, function: Callable[..., Any], args: tuple[Any, ...], layout: dict[str, str], first: int
) -> None:
    os.environ.update(layout)
    os.environ.update({"LOCAL_RANK": str(local_rank), "RANK": str(first + local_rank)})
    function(*args)


def _port(use_port: str | int | None) -> int:
    """``use_port`` as a TCP port (0, a free one, when not given)."""
    if use_port is None:
        return 0
    try:
        port = int(use_port)
    except (TypeError, ValueError):
        port = -1
    if isinstance(use_port, bool) or not 1 <= port <= 65535:
        raise ValueError(f"use_port must be a TCP port between 1 and 65535, got {use_port!r}.")
    return port
