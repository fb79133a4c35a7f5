"""``notebook_launcher`` and ``debug_launcher``: run a training function in several processes from Python.

For code typed into a notebook or an interactive session, which cannot be re-run as a script:
the function (which builds its own ``drivetrain.Accelerator``) runs in forked processes, each
given torchrun's variables (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` …), so the
Accelerator joins them as it would under ``drivetrain launch``. One process runs the function
here. If a process fails, the others are stopped and the error names it.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from typing import Any

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
        **elastic: Accelerate's elastic options (``rdzv_backend`` …) are accepted at their
            defaults only (``rdzv_backend="static"``, ``max_restarts=0`` …): other values are not
            supported.

    Raises:
        ValueError: a bad setting; the first failing process's error (torch's
            ``ProcessRaisedException``/``ProcessExitedException`` naming it).
    """
    asked = [name for name, value in elastic.items() if value not in _NEUTRAL_ELASTIC.get(name, ())]
    if asked:
        raise ValueError(
            f"notebook_launcher({', '.join(f'{name}=...' for name in asked)}) is not supported: drivetrain starts a "
            f"fixed set of processes. Use drivetrain launch (or torchrun) for elastic jobs."
        )
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
    if use_port is None and num_nodes > 1:
        raise ValueError("Several machines need a rendezvous port they agree on: pass use_port=...")
    port = int(use_port) if use_port is not None else _free_port()
    layout = {
        "MASTER_ADDR": master_addr,
        "MASTER_PORT": str(port),
        "WORLD_SIZE": str(processes * num_nodes),
        "LOCAL_WORLD_SIZE": str(processes),
        "NODE_RANK": str(node_rank),
        "ACCELERATE_MIXED_PRECISION": mixed_precision,
    }
    import torch.multiprocessing as mp

    mp.start_processes(
        _run_process,
        args=(function, args, layout, processes * node_rank),
        nprocs=processes,
        join=True,
        start_method="fork",
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


def _free_port() -> int:
    # Released before rank 0's store binds it: a few milliseconds in which another process could take it.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])
