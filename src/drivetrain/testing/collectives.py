"""What the front doors rely on from a set-up strategy's collectives, checked on every rank of a job.

Each check returns the empty string when it holds and otherwise what was wrong; the kit turns
them into rows naming the method to fix. ``barrier`` is checked by ordering, not by time: rank 1
writes a file before entering the barrier after a pause, and rank 0 must find it once its barrier
returns (a barrier that does not wait lets rank 0 through first).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

#: How long rank 1 pauses before the barrier: rank 0 must still be waiting in it by then.
BARRIER_PAUSE = 1.5


def check_collectives(strategy: Any, root: Path) -> dict[str, str]:
    """Run each collective the doors use on ``strategy`` (already set up) and say which misbehave."""
    rank, world = strategy.global_rank, strategy.world_size
    device = strategy.root_device
    results: dict[str, str] = {}

    def attempt(name: str, check: Callable[[], str]) -> None:
        try:
            results[name] = check()
        except Exception as error:  # reported as this method's failure, not the whole program's
            results[name] = f"raised {type(error).__name__}: {error}"

    def ranks() -> str:
        seen = strategy.all_gather_object(rank)
        if sorted(seen) != list(range(world)):
            return f"the processes report global ranks {seen} for world_size={world}; each rank 0..{world - 1} once"
        return ""

    def all_reduce(op: str, expected: float) -> Callable[[], str]:
        def check() -> str:
            value = strategy.all_reduce(torch.tensor([float(rank + 1)], device=device), reduce_op=op)
            got = float(value.reshape(-1)[0])
            return (
                ""
                if abs(got - expected) < 1e-6
                else f"all_reduce(reduce_op={op!r}) of rank+1 gave {got}, expected {expected}"
            )

        return check

    def all_gather() -> str:
        gathered = strategy.all_gather(torch.tensor([float(rank)], device=device))
        if tuple(gathered.shape) != (world, 1):
            return (
                f"all_gather of a (1,) tensor returned shape {tuple(gathered.shape)}; expected ({world}, 1)"
            )
        values = [float(v) for v in gathered.reshape(-1).cpu()]
        return (
            ""
            if values == [float(r) for r in range(world)]
            else f"all_gather returned {values}, expected ranks in order"
        )

    def broadcast() -> str:
        got = strategy.broadcast(f"from rank {rank}", src=0)
        return "" if got == "from rank 0" else f"broadcast(obj, src=0) returned {got!r} on rank {rank}"

    def decision() -> str:
        every = strategy.reduce_boolean_decision(rank == 0, all=True)
        some = strategy.reduce_boolean_decision(rank == 0, all=False)
        if (every, some) != (world == 1, True):
            return f"reduce_boolean_decision(rank == 0) gave all={every}, any={some}; expected all={world == 1}, any=True"
        return ""

    def barrier() -> str:
        marker = root / "results" / f"barrier-{strategy.world_size}"
        marker.parent.mkdir(parents=True, exist_ok=True)
        if rank == 1:
            time.sleep(BARRIER_PAUSE)
            marker.write_text("rank 1 reached the barrier\n")
        strategy.barrier("drivetrain.testing")
        if rank == 0 and not marker.exists():
            return "barrier() returned on rank 0 before rank 1 reached it (it does not wait for the other processes)"
        strategy.barrier("drivetrain.testing-after")
        return ""

    attempt("ranks", ranks)
    attempt("all_reduce_sum", all_reduce("sum", world * (world + 1) / 2))
    attempt("all_reduce_mean", all_reduce("mean", (world + 1) / 2))
    attempt("all_reduce_max", all_reduce("max", float(world)))
    attempt("all_gather", all_gather)
    attempt("broadcast", broadcast)
    attempt("reduce_boolean_decision", decision)
    attempt("barrier", barrier)
    return results
