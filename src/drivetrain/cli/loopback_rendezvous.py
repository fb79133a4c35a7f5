"""A torchrun rendezvous for single-node ``drivetrain launch`` jobs whose store listens on loopback only.

torchrun's own single-node rendezvous (``c10d`` at ``localhost:0``) starts two TCP stores, the
rendezvous store and the store the workers share, and both listen on every network interface:
anyone who can reach the machine can read and write the job's keys. Here the launch process
hosts one store on ``127.0.0.1`` (a free port, chosen by binding port 0) and torchrun uses it for
both: the rendezvous state under torchrun's keys, the workers' process groups under theirs.

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
    from torch.distributed.elastic.rendezvous import rendezvous_handler_registry
    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import DynamicRendezvousHandler

    store = host_store(LOOPBACK, 0, world_size + 1, datetime.timedelta(minutes=30), spans_nodes=False)
    backend_name = f"drivetrain-loopback-{store.port}"  # one per store: a second launch gets its own

    class LoopbackHandler(DynamicRendezvousHandler):
        def get_backend(self) -> str:
            return backend_name

        def _create_tcp_store_server(self, master_addr: str, master_port: int) -> Any:
            return store  # the workers share the rendezvous store: one store, on loopback

    def create_handler(params: Any) -> Any:
        backend = C10dRendezvousBackend(store, params.run_id)
        return LoopbackHandler.from_backend(
            run_id=params.run_id,
            store=store,
            backend=backend,
            min_nodes=params.min_nodes,
            max_nodes=params.max_nodes,
            local_addr=LOOPBACK,
        )

    rendezvous_handler_registry.register(backend_name, create_handler)
    return [f"--rdzv-backend={backend_name}", f"--rdzv-endpoint={LOOPBACK}:{store.port}"]
