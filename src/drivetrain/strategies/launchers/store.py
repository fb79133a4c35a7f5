"""The rendezvous store a launcher (or rank 0) hosts: on a free port, and on loopback unless the job spans nodes.

A single-node job's store is only ever reached from this machine, so it listens on
``127.0.0.1``: nothing else on the network can read or write the job's rendezvous keys. A
multi-node job's store listens on every interface (the other nodes connect to ``MASTER_ADDR``).
Port 0 lets the operating system pick a free port, with no window for another program to take
it between choosing and binding.
"""

from __future__ import annotations

import datetime
import socket

import torch.distributed as dist

LOOPBACK = "127.0.0.1"


def host_store(
    address: str, port: int, world_size: int, timeout: datetime.timedelta, *, spans_nodes: bool
) -> dist.TCPStore:
    """Start the job's rendezvous store in this process (the server) and return it.

    Args:
        address: the address the job's processes connect to (``MASTER_ADDR``).
        port: the port to listen on; 0 for a free one (read it back from ``store.port``).
        world_size: how many processes will connect.
        timeout: how long store operations wait.
        spans_nodes: listen on every interface (other nodes connect) instead of loopback only.
    """
    if spans_nodes:
        return dist.TCPStore(
            address, port, world_size, is_master=True, timeout=timeout, wait_for_workers=False
        )
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((LOOPBACK, port))
        listener.listen(socket.SOMAXCONN)
    except OSError as error:
        listener.close()
        raise RuntimeError(
            f"Cannot listen on {LOOPBACK}:{port} for the job's rendezvous store: {error}. Choose another "
            f"MASTER_PORT, or unset it to let the launcher pick a free port."
        ) from None
    bound = listener.getsockname()[1]
    return dist.TCPStore(
        LOOPBACK,
        bound,
        world_size,
        is_master=True,
        timeout=timeout,
        wait_for_workers=False,
        master_listen_fd=listener.detach(),  # the store owns the socket from here on
    )


def store_address(main_address: str, *, spans_nodes: bool) -> str:
    """The address a job's processes reach :func:`host_store`'s store at."""
    return main_address if spans_nodes else LOOPBACK


def is_loopback(address: str) -> bool:
    """Whether ``address`` names this machine's loopback interface (``127.x.x.x``, ``::1``, ``localhost``)."""
    import ipaddress

    if address == "localhost":
        return True
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


def check_resolvable(address: str, who: str) -> None:
    """``ValueError`` within seconds if ``address`` does not resolve (the store would retry for its whole timeout).

    Args:
        address: rank 0's host, where the rendezvous store listens.
        who: the cluster environment that gave it, for the message.
    """
    try:
        socket.getaddrinfo(address, None)
    except (socket.gaierror, UnicodeError) as error:
        reason = error.strerror if isinstance(error, socket.gaierror) else str(error)
        raise ValueError(
            f"MASTER_ADDR={address!r} does not resolve to an address ({reason}); {who} gives it as rank 0's host. "
            f"Set MASTER_ADDR to rank 0's host name or IP address, reachable from every node."
        ) from None
