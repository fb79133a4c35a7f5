"""A torchrun rendezvous for single-node ``drivetrain launch`` jobs whose store listens on loopback only.

torchrun's own single-node rendezvous (``c10d`` at ``localhost:0``) starts two TCP stores, the
rendezvous store and the store the workers share, and both listen on every network interface:
anyone who can reach the machine can read and write the job's keys. Here the launch process
hosts one store on ``127.0.0.1`` (a free port, chosen by binding port 0) and torchrun uses it for
both: its agent's keys under the run id, the workers' process groups under theirs.

With one node there is nothing to negotiate: this node is node 0 of 1, in every round (a
``--max-restarts`` restart too). So the handler answers at once, as torchrun's ``static``
rendezvous does, instead of running the dynamic rendezvous's join protocol, which sleeps a
random 0 to 0.3 s before its first round (to spread many nodes' first requests) and then keeps a
heartbeat thread running for the whole job.

It is registered with torchrun's rendezvous handler registry (as ``drivetrain-loopback-PORT``)
and used through ``--rdzv-backend``/``--rdzv-endpoint``; torchrun itself is unchanged.
"""

from __future__ import annotations

import datetime
from typing import Any

from drivetrain.strategies.launchers.store import LOOPBACK, host_store


def loopback_rendezvous(world_size: int) -> list[str]:
    """Host the store and register the handler; returns the torchrun arguments that use them.

    The registered handler holds the store, which lives as long as this process.
    """
    from torch.distributed import PrefixStore
    from torch.distributed.elastic.rendezvous import (
        RendezvousHandler,
        RendezvousInfo,
        RendezvousStoreInfo,
        rendezvous_handler_registry,
    )

    store = host_store(LOOPBACK, 0, world_size + 1, datetime.timedelta(minutes=30), spans_nodes=False)
    backend_name = f"drivetrain-loopback-{store.port}"  # one per store: a second launch gets its own

    class LoopbackRendezvous(RendezvousHandler):
        """Node 0 of a one-node job, on the store this process hosts."""

        def __init__(self, run_id: str) -> None:
            self._run_id = run_id
            self._closed = False

        def get_backend(self) -> str:
            return backend_name

        @property
        def use_agent_store(self) -> bool:
            return True  # the workers connect to this store (MASTER_ADDR/MASTER_PORT)

        def next_rendezvous(self) -> Any:
            return RendezvousInfo(
                PrefixStore(self._run_id, store), 0, 1, RendezvousStoreInfo(LOOPBACK, store.port)
            )

        def is_closed(self) -> bool:
            return self._closed

        def set_closed(self) -> None:
            self._closed = True

        def num_nodes_waiting(self) -> int:
            return 0  # one node: nobody else can join

        def get_run_id(self) -> str:
            return self._run_id

        def shutdown(self) -> bool:
            return True  # the store is this process's; it closes when the process ends

    def create_handler(params: Any) -> Any:
        return LoopbackRendezvous(params.run_id)

    rendezvous_handler_registry.register(backend_name, create_handler)
    return [f"--rdzv-backend={backend_name}", f"--rdzv-endpoint={LOOPBACK}:{store.port}"]
