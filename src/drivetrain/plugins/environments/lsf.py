"""Processes started by ``jsrun`` in an IBM Spectrum LSF job (Summit/Sierra-style CSM clusters).

``jsrun`` gives each process ``JSM_NAMESPACE_SIZE`` (world size), ``JSM_NAMESPACE_RANK`` (global
rank) and ``JSM_NAMESPACE_LOCAL_RANK`` (local rank); LSF gives the job ``LSB_JOBID`` and its
hosts, in ``LSB_DJOB_RANKFILE`` (a file with one host per line, one line per slot) or
``LSB_MCPU_HOSTS`` (``"host1 n1 host2 n2 ..."``).

How we read the host list: on the clusters where ``jsrun`` exists, the first host LSF lists is
the *launch node* (``batch1 1 h41n08 42 ...``), which runs the job script but no ranks. We
therefore drop the first entry and keep the remaining hosts, de-duplicated in order, as the
compute hosts: rank 0 runs on the first of them, and a process's node rank is its host's index
among them. Set ``MASTER_ADDR`` to override the rendezvous host.
"""

from __future__ import annotations

import ipaddress
import socket

from drivetrain.plugins.environments import _environ as env
from drivetrain.plugins.environments.launched import LaunchedEnvironment, LayoutVariables

_WHO = "LSFEnvironment"


def _hosts_from_rankfile(path: str) -> list[str]:
    try:
        with open(path, encoding="utf-8") as handle:
            return [line.strip() for line in handle if line.strip()]
    except OSError as error:
        raise ValueError(f"Cannot read LSB_DJOB_RANKFILE={path!r}: {error}.") from None


def _hosts_from_mcpu(value: str) -> list[str]:
    fields = value.split()
    if not fields or len(fields) % 2:
        raise ValueError(
            f"The environment variable LSB_MCPU_HOSTS={value!r} is malformed; expected pairs of host "
            "name and slot count, like 'batch1 1 node1 42 node2 42'."
        )
    hosts = fields[0::2]
    for count in fields[1::2]:
        env.parse_int("LSB_MCPU_HOSTS", count, minimum=1)
    return hosts


def _is_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _index_of_this_host(hosts: list[str], hostname: str) -> int | None:
    """Where ``hostname`` (this machine) appears in ``hosts``; ``None`` when it does not."""
    if hostname in hosts:
        return hosts.index(hostname)
    if not _is_address(hostname):
        short = hostname.split(".")[0]
        for index, host in enumerate(hosts):
            if not _is_address(host) and host.split(".")[0] == short:
                return index
    listed = [(index, host) for index, host in enumerate(hosts) if _is_address(host)]
    if not listed:
        return None
    resolved = _addresses_of(hostname)
    for index, host in listed:
        if ipaddress.ip_address(host) in resolved:
            return index
    for index, host in listed:
        if _assigned_here(host):
            return index
    return None


def _addresses_of(hostname: str) -> set[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    try:
        found = socket.getaddrinfo(hostname, None, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError):
        return set()
    return {ipaddress.ip_address(str(info[4][0]).split("%")[0]) for info in found}


def _assigned_here(address: str) -> bool:
    """Whether ``address`` belongs to one of this machine's network interfaces (it can be bound)."""
    family = socket.AF_INET6 if ipaddress.ip_address(address).version == 6 else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.bind((address, 0))
    except OSError:
        return False
    return True


class LSFEnvironment(LaunchedEnvironment):
    """Reads the layout ``jsrun`` announced, and the job's hosts from LSF."""

    who = _WHO

    def compute_hosts(self) -> list[str]:
        """The hosts that run ranks, in LSF's order, without the launch node.

        Raises:
            ValueError: Neither ``LSB_DJOB_RANKFILE`` nor ``LSB_MCPU_HOSTS`` is usable.
        """
        rankfile = env.get_str("LSB_DJOB_RANKFILE")
        mcpu = env.get_str("LSB_MCPU_HOSTS")
        if rankfile:
            listed = _hosts_from_rankfile(rankfile)
            source = f"LSB_DJOB_RANKFILE={rankfile}"
        elif mcpu:
            listed = _hosts_from_mcpu(mcpu)
            source = "LSB_MCPU_HOSTS"
        else:
            raise ValueError(f"{_WHO} needs LSB_DJOB_RANKFILE or LSB_MCPU_HOSTS to find the job's hosts.")
        hosts = list(dict.fromkeys(listed[1:]))
        if not hosts:
            raise ValueError(
                f"{_WHO} found only the launch node {listed[:1]} in {source}; no compute host is listed."
            )
        return hosts

    @property
    def main_address(self) -> str:
        """``MASTER_ADDR`` when set, else the first compute host."""
        return env.get_str("MASTER_ADDR") or self.compute_hosts()[0]

    @property
    def main_port(self) -> int:
        """``MASTER_PORT`` when set, else ``10000 + crc32(LSB_JOBID) % 22768`` (same on every process)."""
        port = env.get_port("MASTER_PORT")
        if port is not None:
            return port
        return env.port_from_job_id(env.require_str("LSB_JOBID", who=_WHO))

    @staticmethod
    def detect() -> bool:
        """True inside a ``jsrun`` process of an LSF job."""
        required = ("LSB_JOBID", "JSM_NAMESPACE_SIZE", "JSM_NAMESPACE_RANK", "JSM_NAMESPACE_LOCAL_RANK")
        has_hosts = env.is_set("LSB_DJOB_RANKFILE") or env.is_set("LSB_MCPU_HOSTS")
        return has_hosts and all(env.is_set(name) for name in required)

    def layout_variables(self) -> LayoutVariables:
        return LayoutVariables(
            world_size="JSM_NAMESPACE_SIZE",
            global_rank="JSM_NAMESPACE_RANK",
            local_rank="JSM_NAMESPACE_LOCAL_RANK",
            set_by=", set by jsrun",
            world_size_fix="Change jsrun's resource sets (-n/-r) instead.",
            rank_fix="Ranks under jsrun are assigned by jsrun; do not set them.",
        )

    def node_rank(self) -> int:
        """The index of this host among the compute hosts.

        LSF lists hosts by name or by IP address. A name matches ``socket.gethostname()`` exactly
        or by its first label (LSF may list short names while the host reports its FQDN, or the
        other way round); an address matches one this host's name resolves to, or one assigned to
        this machine (it can be bound). Addresses are never compared label by label: their first
        "label" is an octet that many hosts share.

        Raises:
            ValueError: This host is not among them.
        """
        hosts = self.compute_hosts()
        hostname = socket.gethostname()
        index = _index_of_this_host(hosts, hostname)
        if index is None:
            raise ValueError(
                f"{_WHO} cannot find this host {hostname!r} among the job's compute hosts {hosts}. "
                "Is this process running inside the LSF job that set LSB_DJOB_RANKFILE/LSB_MCPU_HOSTS?"
            )
        return index

    def processes_per_node(self) -> int | None:
        hosts = self.compute_hosts()
        world = self.world_size()
        return world // len(hosts) if hosts and world % len(hosts) == 0 else None

    def validate_settings(self, num_devices: int, num_nodes: int) -> None:
        """Check ``num_nodes`` against the compute hosts and ``devices`` against ranks per host.

        Raises:
            ValueError: Either disagrees with the job.
        """
        hosts = self.compute_hosts()
        if len(hosts) != num_nodes:
            raise ValueError(
                f"The LSF job has {len(hosts)} compute host(s) but num_nodes={num_nodes}. Pass "
                f"num_nodes={len(hosts)}, or request {num_nodes} node(s) with `#BSUB -nnodes {num_nodes}`."
            )
        per_node = env.get_int("JSM_NAMESPACE_LOCAL_SIZE", minimum=1)
        if per_node is not None and per_node != num_devices:
            raise ValueError(
                f"jsrun started {per_node} process(es) per host (JSM_NAMESPACE_LOCAL_SIZE={per_node}) but "
                f"devices={num_devices}. Pass devices={per_node}, or launch {num_devices} per host "
                f"(e.g. `jsrun -r {num_devices}`)."
            )
        total = self.world_size()
        if total != num_devices * num_nodes:
            raise ValueError(
                f"jsrun started {total} process(es) in all (JSM_NAMESPACE_SIZE={total}) but "
                f"devices={num_devices} on num_nodes={num_nodes} needs {num_devices * num_nodes}. "
                f"Launch {num_devices} per host (e.g. `jsrun -r {num_devices}`), or pass "
                "devices=<processes per host>."
            )

    def __repr__(self) -> str:
        return env.environment_repr(
            self, main_address=lambda: self.main_address, main_port=lambda: self.main_port
        )
