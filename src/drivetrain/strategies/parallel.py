"""Strategies that run one process per device, on one or many nodes, joined by a process group."""

from __future__ import annotations

import dataclasses
import datetime
import os
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Unpack

import torch
import torch.distributed as dist
from torch import Tensor

from drivetrain._utilities.renamed import sync_renamed_hooks
from drivetrain.strategies.collective_monitor import DEBUG_STALL_TIMEOUT, STALL_TIMEOUT, CollectiveMonitor
from drivetrain.strategies.collectives import (
    all_gather_checked,
    all_gather_objects,
    all_reduce_copy,
    broadcast_object,
    device_barrier,
    process_group_backend_for,
)
from drivetrain.strategies.launchers.launcher import ProcessFailedError
from drivetrain.strategies.launchers.parent_death import die_with_parent
from drivetrain.strategies.preemption import Preempted, PreemptionWatch
from drivetrain.strategies.process_group import (
    EXIT_WAIT_SECONDS,
    crashed,
    leave_at_exit_later,
    open_rendezvous_store,
    wait_for_peers_through_store,
)
from drivetrain.strategies.process_group_options import (
    ProcessGroupArguments,
    ProcessGroupOptions,
)
from drivetrain.strategies.rank_failures import (
    is_lost_peer,
    read_failures,
    record_failure,
    root_cause,
    write_torchelastic_error_file,
)
from drivetrain.strategies.strategy import Strategy, _check_reduce_op

if TYPE_CHECKING:
    from drivetrain.accelerators.accelerator import Accelerator
    from drivetrain.plugins.environments.cluster_environment import ClusterEnvironment
    from drivetrain.plugins.io.checkpoint_io import CheckpointIO
    from drivetrain.plugins.precision.precision import Precision
    from drivetrain.strategies.launchers.launcher import Launcher


# Hooks that were private at first; subclasses overriding the old names keep working, with a warning.
_RENAMED_HOOKS = {
    "_set_world_ranks": "set_world_ranks",
    "_release_communication_state": "release_communication_state",
}


class ParallelStrategy(Strategy):
    """Base of multi-process strategies: ranks, the process group and collectives.

    Args:
        parallel_devices: one device per local process (set by :func:`drivetrain.connect`).
        cluster_environment: where ranks and the rendezvous address come from.
        **options: the process-group settings every parallel strategy takes (``num_nodes``,
            ``start_method``, ``process_group_backend``, ``timeout``, ``stall_timeout``,
            ``debug_collectives``): see :class:`~drivetrain.strategies.process_group_options.ProcessGroupArguments`.
            ``stall_timeout`` and ``debug_collectives`` are explained in
            :mod:`drivetrain.strategies.collective_monitor`; ``stall_timeout`` left at its default is 10 s
            while ``debug_collectives`` is on.

    Subclasses may override :meth:`set_world_ranks` and :meth:`release_communication_state`.
    """

    kind = "parallel"

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        sync_renamed_hooks(cls, _RENAMED_HOOKS)

    def __init__(
        self,
        accelerator: Accelerator | None = None,
        parallel_devices: list[torch.device] | None = None,
        cluster_environment: ClusterEnvironment | None = None,
        checkpoint_io: CheckpointIO | None = None,
        precision: Precision | None = None,
        *,
        precision_plugin: Precision | None = None,
        **options: Unpack[ProcessGroupArguments],
    ) -> None:
        super().__init__(accelerator, checkpoint_io, precision, precision_plugin=precision_plugin)
        self._options = ProcessGroupOptions.from_arguments(type(self).__name__, options)
        self._launcher: Launcher | None = None
        self._parallel_devices = list(parallel_devices) if parallel_devices is not None else None
        self._cluster_environment = cluster_environment
        self._owns_process_group = False
        # The rendezvous store: handed over by a launcher of this process (see launchers/), or joined
        # (hosted, on rank 0) by setup_process_group.
        self._rendezvous_store: dist.Store | None = None
        self._setups = 0
        self._groups_formed = 0  # process groups joined by every rank (init_process_group returned)
        self._joining = False  # inside init_process_group: waiting, in C++, for every rank to arrive
        self._watches = 0  # preemption watches made: each run's keys in the store are its own
        # The error this rank is leaving with (see on_exception): no collective is entered after it.
        self._failure: BaseException | None = None
        self._monitor = CollectiveMonitor(None, "", 0, 1)  # replaced by a live one with the process group

    def given_plugins(self) -> dict[str, Any]:
        given = super().given_plugins()
        if self._cluster_environment is not None:
            given["cluster_environment"] = self._cluster_environment
        return given

    def given_devices(self) -> list[torch.device] | None:
        return list(self._parallel_devices) if self._parallel_devices is not None else None

    def connect_plugins(
        self,
        *,
        cluster_environment: ClusterEnvironment | None,
        parallel_devices: list[torch.device],
        num_nodes: int,
        **plugins: Any,
    ) -> None:
        super().connect_plugins(
            cluster_environment=cluster_environment,
            parallel_devices=parallel_devices,
            num_nodes=num_nodes,
            **plugins,
        )
        if self._parallel_devices is None:
            self._parallel_devices = list(parallel_devices)
        if self._cluster_environment is None:
            self._cluster_environment = cluster_environment
        self._options = dataclasses.replace(self._options, num_nodes=num_nodes)
        self.set_world_ranks()

    # -- where this process stands --------------------------------------------------------
    @property
    def cluster_environment(self) -> ClusterEnvironment:
        if self._cluster_environment is None:
            from drivetrain.plugins.environments import detect_cluster_environment

            self._cluster_environment = detect_cluster_environment()
        return self._cluster_environment

    @property
    def parallel_devices(self) -> list[torch.device]:
        if self._parallel_devices is None:
            raise RuntimeError(
                f"{type(self).__name__} has no devices yet; build it through drivetrain.connect() or pass "
                f"parallel_devices=[...]."
            )
        return self._parallel_devices

    @property
    def process_group_options(self) -> ProcessGroupOptions:
        """How this strategy's processes start and join their group (given as keyword arguments)."""
        return self._options

    @property
    def start_method(self) -> str:
        return self._options.start_method

    @property
    def launcher(self) -> Launcher | None:
        if self._launcher is None:
            from drivetrain.strategies.launchers import MultiprocessingLauncher, SubprocessScriptLauncher

            if self.start_method == "popen":
                self._launcher = SubprocessScriptLauncher(self)
            else:
                self._launcher = MultiprocessingLauncher(self, start_method=self.start_method)
        return self._launcher

    @property
    def num_processes(self) -> int:
        """Processes on each node."""
        return len(self.parallel_devices)

    @property
    def num_nodes(self) -> int:
        return self._options.num_nodes

    @property
    def global_rank(self) -> int:
        return self.cluster_environment.global_rank()

    @property
    def local_rank(self) -> int:
        return self.cluster_environment.local_rank()

    @property
    def node_rank(self) -> int:
        return self.cluster_environment.node_rank()

    @property
    def world_size(self) -> int:
        return self.cluster_environment.world_size()

    @property
    def root_device(self) -> torch.device:
        return self.parallel_devices[self.local_rank]

    @property
    def distributed_sampler_kwargs(self) -> dict[str, int]:
        return {"num_replicas": self.world_size, "rank": self.global_rank}

    @property
    def process_group_backend(self) -> str:
        return self._options.process_group_backend or process_group_backend_for(self.root_device)

    @property
    def timeout(self) -> datetime.timedelta:
        return self._options.timeout

    def set_world_ranks(self) -> None:
        """Tell the cluster environment the world size and this process's global rank.

        Called by :func:`drivetrain.connect` once the devices and nodes are known. Override it when
        the ranks come from somewhere else (the XLA runtime, a scheduler the environment cannot
        read); an environment whose launcher created the processes already knows them.
        """
        environment = self.cluster_environment
        if environment.creates_processes_externally:
            return
        environment.set_world_size(self.num_nodes * self.num_processes)
        environment.set_global_rank(self.node_rank * self.num_processes + self.local_rank)

    # -- the process group ------------------------------------------------------------------
    def setup_environment(self) -> None:
        launcher_pid = self.cluster_environment.launcher_pid
        if launcher_pid is not None:
            die_with_parent(
                launcher_pid, self.global_rank
            )  # torchrun killed with -9 must not leave this rank training on
        super().setup_environment()
        self.setup_process_group()

    def setup_process_group(self) -> None:
        """Join (or create) the default process group for this job."""
        if dist.is_initialized():
            if dist.get_world_size() != self.world_size or dist.get_rank() != self.global_rank:
                raise RuntimeError(
                    f"A process group already exists with rank {dist.get_rank()} of {dist.get_world_size()}, but "
                    f"this job is rank {self.global_rank} of {self.world_size}. Destroy it first "
                    f"(torch.distributed.destroy_process_group()) or let drivetrain create it."
                )
            return
        environment = self.cluster_environment
        kwargs: dict[str, Any] = {
            "backend": self.process_group_backend,
            "world_size": self.world_size,
            "rank": self.global_rank,
            "timeout": self.timeout,
        }
        if self.root_device.type == "cuda":
            kwargs["device_id"] = self.root_device  # eager NCCL init: failures surface here, not mid-step
        if self._rendezvous_store is None:
            # Kept across teardown() so a later setup (fit, then test) finds the same rendezvous.
            self._rendezvous_store = open_rendezvous_store(
                environment, self.global_rank, self.world_size, self.num_nodes, self.timeout
            )
        # Each setup gets fresh keys: a second group must not read the first one's addresses.
        self._setups += 1
        namespace = f"drivetrain/{environment.rendezvous_namespace()}/{self._setups}"
        self._joining = True
        try:
            dist.init_process_group(store=dist.PrefixStore(namespace, self._rendezvous_store), **kwargs)
        finally:
            self._joining = False
        self._groups_formed += 1
        self._owns_process_group = True
        self._failure = None
        self._monitor = CollectiveMonitor(
            self._rendezvous_store,
            f"{environment.rendezvous_namespace()}/{self._setups}",
            self.global_rank,
            self.world_size,
            debug=self.debug_collectives,
            stall_timeout=self.stall_timeout,
            # Left at its default (the very constant, not an equal number given), debug mode waits less.
            debug_stall_timeout=DEBUG_STALL_TIMEOUT
            if self.stall_timeout is STALL_TIMEOUT
            else self.stall_timeout,
            on_stuck=self._end_stuck_rank,
        )
        self._monitor.start()
        # Scripts that never call teardown() (Accelerate-style ones rarely do) still exit cleanly.
        leave_at_exit_later(self)

    def teardown(self) -> None:
        self._leave_process_group(wait_for_peers=True)
        super().teardown()

    def leave_at_exit(self) -> None:
        """Leave the process group as a rank does at interpreter exit (peers waited for, bounded)."""
        failed = crashed() or self._failure is not None
        self._leave_process_group(wait_for_peers=False, store_wait=0.0 if failed else EXIT_WAIT_SECONDS)

    def preemption_watch(self, signals: Iterable[int], position: Callable[[], int]) -> PreemptionWatch:
        """The ranks agree on the stop step through the job's rendezvous store (see the base class)."""
        self._watches += 1
        environment = self.cluster_environment
        prefix = f"{environment.rendezvous_namespace()}/{self._setups}/{self._watches}"
        store = self._rendezvous_store if self._owns_process_group else None
        self.preemption = PreemptionWatch(signals, position, store, prefix, self.global_rank, self.world_size)
        return self.preemption

    def on_exception(self, exception: BaseException) -> None:
        """This rank is leaving because of ``exception``: tell the others why, and stop talking to them.

        The failure is recorded in the job's rendezvous store (and in torchrun's error file), so a
        peer whose collective breaks and the launcher both name this rank as the cause. From now
        on the strategy's collectives raise at once, and :meth:`teardown` leaves the process group
        without waiting for peers: they are inside other collectives and would never meet this
        rank in a barrier. Only the first call counts.
        """
        if self._failure is not None or isinstance(exception, Preempted):
            return  # a preemption stop is agreed by every rank: nobody waits in a collective for this one
        self._failure = exception
        if not self._owns_process_group or self._rendezvous_store is None:
            return
        environment = self.cluster_environment
        record = record_failure(
            self._rendezvous_store, environment.rendezvous_namespace(), self.global_rank, exception
        )
        error_file = environment.error_file
        if error_file:
            write_torchelastic_error_file(error_file, exception, record)

    @property
    def failure(self) -> BaseException | None:
        """The error this rank is leaving the job with (see :meth:`on_exception`), if any."""
        return self._failure

    @property
    def stall_timeout(self) -> float | None:
        return self._options.stall_timeout

    @property
    def debug_collectives(self) -> bool:
        return self._options.debug_collectives

    @debug_collectives.setter
    def debug_collectives(self, value: bool) -> None:
        """Turn the checks on or off between collectives; every rank must do it at the same point."""
        if not isinstance(value, bool):
            raise TypeError(f"debug_collectives must be True or False, got {value!r}.")
        monitor = self._monitor
        if value and monitor.store is None and self.world_size > 1:
            raise ValueError(
                f"Debug mode checks collectives through the rendezvous store of the strategy that set up the "
                f"process group, and this {type(self).__name__} joined a group set up elsewhere. Turn debug mode on "
                f"for the first Accelerator of the process (Accelerator(debug=True), or ACCELERATE_DEBUG_MODE=1)."
            )
        self._options = dataclasses.replace(self._options, debug_collectives=value)
        monitor.debug = value and monitor.store is not None and monitor.world_size > 1

    def _collective(self, operation: str, payload: Any, function: Callable[..., Any], *args: Any) -> Any:
        """Run one collective: refused after this rank failed, noted for the checks, explained if a peer died."""
        failure = self._failure
        if failure is not None:
            raise RuntimeError(
                f"Rank {self.global_rank} cannot enter the collective {operation}(): it is leaving the job after "
                f"{type(failure).__name__}: {failure}. The other ranks are elsewhere and would never meet it there; "
                "collectives after an error (in on_exception or teardown hooks, say) must not run."
            )
        monitor = self._monitor
        monitor.enter(operation, payload)
        try:
            return function(*args)
        except RuntimeError as error:
            self._raise_root_cause(error, operation)
            raise
        finally:
            monitor.current = None

    def _raise_root_cause(self, error: RuntimeError, operation: str) -> None:
        """When ``error`` says a peer went away and that peer recorded why, raise that instead."""
        store = self._rendezvous_store
        if store is None or not is_lost_peer(error):
            return
        records = read_failures(store, self.cluster_environment.rendezvous_namespace())
        cause = root_cause([record for record in records if record.rank != self.global_rank])
        if cause is None or cause[1] is None:
            return
        record = cause[1]
        raise ProcessFailedError(
            f"{record.describe()}; rank {self.global_rank} lost it in {operation}()", rank=record.rank
        ) from error

    def _end_stuck_rank(self, error: BaseException) -> None:
        """The watchdog found this rank stuck inside the backend: report, record, and end the process."""
        os.write(2, f"[drivetrain] {type(error).__name__}: {error}\n".encode())
        self.on_exception(error)
        os._exit(1)

    def __getstate__(self) -> dict[str, Any]:
        # Spawned ranks join the rendezvous themselves; stores and groups do not cross processes.
        state = self.__dict__.copy()
        state["_rendezvous_store"] = None
        state["_owns_process_group"] = False
        state["_failure"] = None
        state["_monitor"] = CollectiveMonitor(None, "", 0, 1)
        state.pop("preemption", None)  # signal handlers and a thread of this process
        return state

    def _leave_process_group(self, wait_for_peers: bool, store_wait: float = 0.0) -> None:
        if self._owns_process_group and dist.is_initialized():
            self.release_communication_state()
            if store_wait > 0:
                self._wait_for_peers_through_store(store_wait)
            if wait_for_peers and self._failure is None:
                # Leave together: a rank that destroys its group (and, on rank 0, the rendezvous
                # store it hosts) while a peer still uses them makes that peer abort at exit.
                try:
                    self.barrier("teardown")  # watched too: a peer stuck elsewhere is reported
                except RuntimeError:
                    pass  # a peer is already gone; the launcher reports that
            self._monitor.stop()
            dist.destroy_process_group()
        self._monitor.stop()
        self._owns_process_group = False

    def _wait_for_peers_through_store(self, seconds: float) -> None:
        """A barrier on the rendezvous store that gives up after ``seconds`` (works on any backend)."""
        key = f"drivetrain/{self.cluster_environment.rendezvous_namespace()}/{self._setups}/leaving"
        wait_for_peers_through_store(self._rendezvous_store, key, self.world_size, seconds)

    def release_communication_state(self) -> None:
        """Free what holds on to the process group (DDP's reducers) before it is destroyed.

        Called at teardown and at interpreter exit, before the process group goes; override it to
        drop the strategy's own references to the group (wrapped modules, communication hooks).
        """

    # Deprecated: the private names of the two hooks above (see _RENAMED_HOOKS).
    _set_world_ranks = set_world_ranks
    _release_communication_state = release_communication_state

    # -- collectives ----------------------------------------------------------------------------
    def all_reduce(self, tensor: Tensor, group: Any | None = None, reduce_op: str = "mean") -> Tensor:
        _check_reduce_op(reduce_op)
        if not dist.is_initialized():
            return tensor
        return self._collective("all_reduce", [tensor, reduce_op], all_reduce_copy, tensor, reduce_op, group)

    def all_gather(self, tensor: Tensor, group: Any | None = None, sync_grads: bool = False) -> Tensor:
        if not dist.is_initialized():
            return tensor.unsqueeze(0)
        return self._collective("all_gather", tensor, all_gather_checked, tensor, group, sync_grads)

    def all_gather_object(self, obj: Any) -> list[Any]:
        if not dist.is_initialized():
            return [obj]
        return self._collective("all_gather_object", None, all_gather_objects, obj)

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        if not dist.is_initialized():
            return obj
        device = self.root_device if self.process_group_backend == "nccl" else None
        return self._collective("broadcast", f"src={src}", broadcast_object, obj, src, device)

    def barrier(self, name: str | None = None) -> None:
        if not dist.is_initialized():
            return
        device_ids = [self.root_device.index or 0] if self.process_group_backend == "nccl" else None
        self._collective("barrier", None, device_barrier, device_ids)

    def reduce_boolean_decision(self, decision: bool, all: bool = True) -> bool:
        if not dist.is_initialized():
            return decision
        votes = torch.tensor(int(bool(decision)), device=self.root_device)
        self._collective("reduce_boolean_decision", "all" if all else "any", dist.all_reduce, votes)
        count = int(votes.item())
        return count == self.world_size if all else count > 0

    def __repr__(self) -> str:
        devices = self._parallel_devices if self._parallel_devices is not None else "unset"
        return (
            f"{type(self).__name__}(devices={devices}, num_nodes={self.num_nodes}, "
            f"precision={self._precision!r})"
        )
