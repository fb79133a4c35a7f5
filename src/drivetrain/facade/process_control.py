"""The Accelerator's questions and orders about processes: ranks, printing, waiting, collectives.

The base of :class:`drivetrain.Accelerator`; everything here goes through ``self.strategy``.
"""

from __future__ import annotations

import functools
import warnings
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import torch

from drivetrain._utilities import console
from drivetrain.utils import collectives

if TYPE_CHECKING:
    from drivetrain.facade.prepared import PreparedObjects
    from drivetrain.facade.process_state import AcceleratorState
    from drivetrain.facade.state import GradientState
    from drivetrain.strategies.preemption import PreemptionWatch
    from drivetrain.strategies.strategy import Strategy
    from drivetrain.utils.configuration import DataLoaderConfiguration

F = TypeVar("F", bound=Callable[..., Any])


class ProcessControl:
    """Ranks, process-restricted execution, synchronisation and collectives (the Accelerator's base).

    Args:
        strategy: the wired strategy every question and order goes through.
        gradient_state: the Accelerator's accumulation and active-loader state.
        dataloader_config: how ``prepare`` prepares loaders.
        objects: the Accelerator's registry of prepared objects.
    """

    _preemption: PreemptionWatch | None = None
    _preemption_checks = 0

    def __init__(
        self,
        strategy: Strategy,
        gradient_state: GradientState,
        dataloader_config: DataLoaderConfiguration,
        objects: PreparedObjects,
    ) -> None:
        self.strategy = strategy
        self.gradient_state = gradient_state
        self.dataloader_config = dataloader_config
        self._objects = objects
        self._trigger = False

    @property
    def state(self) -> AcceleratorState:
        raise NotImplementedError

    def _require_processes(self, what: str) -> None:
        """Raise if this Accelerator's processes are yet to be started (``ddp_spawn``/``ddp_fork``)."""

    # -- where this process stands ----------------------------------------------------------
    @property
    def device(self) -> torch.device:
        """The device this process computes on."""
        return self.strategy.root_device

    @property
    def num_processes(self) -> int:
        """Processes in the whole run."""
        return self.strategy.world_size

    @property
    def process_index(self) -> int:
        """This process's global rank."""
        return self.strategy.global_rank

    @property
    def local_process_index(self) -> int:
        """This process's rank on its node."""
        return self.strategy.local_rank

    @property
    def is_main_process(self) -> bool:
        """True on exactly one process of the run (global rank 0)."""
        return self.strategy.global_rank == 0

    @property
    def is_local_main_process(self) -> bool:
        """True on one process per node (local rank 0)."""
        return self.strategy.local_rank == 0

    @property
    def is_last_process(self) -> bool:
        """True on the process with the highest global rank."""
        return self.strategy.global_rank == self.strategy.world_size - 1

    @property
    def use_distributed(self) -> bool:
        """Whether the run has more than one process."""
        return self.strategy.world_size > 1

    # -- output and synchronisation --------------------------------------------------------
    def print(self, *args: Any, **kwargs: Any) -> None:
        """``print`` (same arguments) on the local main process only (once per node), above any progress bar."""
        if self.is_local_main_process:
            console.print_line(*args, **kwargs)

    def wait_for_everyone(self) -> None:
        """Block until every process reaches this point."""
        self._require_processes("wait_for_everyone")
        self.strategy.barrier("drivetrain.Accelerator.wait_for_everyone")

    @contextmanager
    def main_process_first(self) -> Iterator[None]:
        """Run the block on the main process first, then on all others (e.g. download, then read)."""
        with self._first(self.is_main_process):
            yield

    @contextmanager
    def local_main_process_first(self) -> Iterator[None]:
        """Run the block on each node's local main process first, then on the node's others."""
        with self._first(self.is_local_main_process):
            yield

    @contextmanager
    def _first(self, leader: bool) -> Iterator[None]:
        if not leader:
            self.wait_for_everyone()
        yield
        if leader:
            self.wait_for_everyone()

    # -- process-restricted functions --------------------------------------------------------
    def on_main_process(self, function: F) -> F:
        """Decorator: run ``function`` on the main process only (it returns ``None`` elsewhere)."""
        return self._only_where(function, lambda: self.is_main_process)

    def on_local_main_process(self, function: F) -> F:
        """Decorator: run ``function`` on each node's local main process only."""
        return self._only_where(function, lambda: self.is_local_main_process)

    def on_last_process(self, function: F) -> F:
        """Decorator: run ``function`` on the last process only."""
        return self._only_where(function, lambda: self.is_last_process)

    def on_process(self, function: F | None = None, process_index: int | None = None) -> Any:
        """Decorator: run ``function`` on the process with global rank ``process_index`` only.

        Use as ``@accelerator.on_process(process_index=1)``.
        """
        if function is None:
            return functools.partial(self.on_process, process_index=process_index)
        if process_index is None:
            raise ValueError("on_process needs process_index=...: @accelerator.on_process(process_index=1).")
        return self._only_where(function, lambda: self.process_index == process_index)

    def on_local_process(self, function: F | None = None, local_process_index: int | None = None) -> Any:
        """Decorator: run ``function`` on the process with local rank ``local_process_index`` only."""
        if function is None:
            return functools.partial(self.on_local_process, local_process_index=local_process_index)
        if local_process_index is None:
            raise ValueError("on_local_process needs local_process_index=...")
        return self._only_where(function, lambda: self.local_process_index == local_process_index)

    @staticmethod
    def _only_where(function: F, condition: Callable[[], bool]) -> F:
        @functools.wraps(function)
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            return function(*args, **kwargs) if condition() else None

        return wrapped  # type: ignore[return-value]

    # -- collectives ----------------------------------------------------------------------------
    def gather(self, tensor: Any) -> Any:
        """Concatenate ``tensor`` (nested allowed) from all processes along the first dimension.

        Includes the items repeated to even out the last step; see :meth:`gather_for_metrics`.
        Tensors of different shapes on different processes are a ``ValueError`` naming the ranks;
        pad them first with :meth:`pad_across_processes`.
        """
        self._require_processes("gather")
        return collectives.gather(self.strategy, tensor)

    def gather_for_metrics(self, input_data: Any, use_gather_object: bool = False) -> Any:
        """Gather like :meth:`gather` (objects are gathered as objects), then drop the items the
        data loader repeated to even out its last step, so metrics see each item exactly once."""
        self._require_processes("gather_for_metrics")
        strategy = self.strategy
        loader = self.gradient_state.active_dataloader
        # even_batches=False: the last batches may differ in size (gathered with their sizes), and
        # the processes may differ in their number of batches, which no gather can survive.
        uneven = strategy.world_size > 1 and loader is not None and _uneven_shares(loader)
        if use_gather_object:
            gathered = collectives.gather_object(strategy, input_data)
        else:
            last = uneven and loader is not None and loader.end_of_dataloader
            gathered = collectives.gather_leaves(strategy, input_data, uneven=last)
        if strategy.world_size > 1 and loader is not None and loader.end_of_dataloader and loader.padding:
            if use_gather_object:
                gathered = gathered[: max(0, len(gathered) - loader.padding)]
            else:
                gathered = collectives.drop_repeated(gathered, loader.padding)
        return gathered

    def reduce(self, tensor: Any, reduction: str = "sum", scale: float = 1.0) -> Any:
        """Reduce ``tensor`` (nested allowed) over all processes, times ``scale``.

        ``reduction``: ``"sum"`` (default), ``"mean"``, ``"max"``, ``"min"``, ``"product"``, or
        ``"none"`` (no communication).
        """
        self._require_processes("reduce")
        return collectives.reduce(self.strategy, tensor, reduction, scale)

    def pad_across_processes(
        self, tensor: Any, dim: int = 0, pad_index: int = 0, pad_first: bool = False
    ) -> Any:
        """Pad ``tensor`` (nested allowed) along ``dim`` to its largest size on any process."""
        self._require_processes("pad_across_processes")
        return collectives.pad_across_processes(self.strategy, tensor, dim, pad_index, pad_first)

    def split_between_processes(self, inputs: Any, apply_padding: bool = False) -> Any:
        """Context manager giving this process its share of a list, tuple, tensor, ``datasets.Dataset`` or dict of them."""
        self._require_processes("split_between_processes")
        return collectives.split_between_processes(self.strategy, inputs, apply_padding)

    # -- uneven inputs -------------------------------------------------------------------------
    @contextmanager
    def join_uneven_inputs(
        self, joinables: Sequence[Any], even_batches: bool | None = None
    ) -> Iterator[None]:
        """Let processes run different numbers of batches with DDP (torch's ``Join`` over ``joinables``).

        Args:
            joinables: the prepared (DDP) models, and ``ZeroRedundancyOptimizer``s, to join.
            even_batches: inside the block, the prepared map-style loaders use this instead of the
                Accelerator's ``even_batches`` (``False``: no repeated items, uneven last batches).
                Dispatching loaders (iterable data) keep theirs, with a warning.

        With one process there is nothing to join; under strategies other than DDP it warns and
        has no effect.
        """
        from drivetrain.utils.configuration import DistributedType
        from drivetrain.utils.dynamo import uncompiled

        joinables = [uncompiled(joinable) for joinable in joinables]
        ddp_like = (DistributedType.MULTI_CPU, DistributedType.MULTI_GPU, DistributedType.MULTI_XPU)
        kind = self.state.distributed_type
        join = self.strategy.join(joinables, enable=False) if kind in ddp_like else None
        if join is None:
            if kind != DistributedType.NO:
                warnings.warn(
                    f"Joining uneven inputs is only supported for multi-GPU (and multi-CPU) DDP training; under "
                    f"{kind.value} join_uneven_inputs has no effect.",
                    UserWarning,
                    stacklevel=3,
                )
            yield
            return
        overridden: list[tuple[Any, bool]] = []
        if even_batches is None:
            even_batches = self.dataloader_config.even_batches
        else:
            skipped = False
            for loader in self._objects.dataloaders:
                sampler: Any = loader.batch_sampler
                if not hasattr(sampler, "even_batches"):
                    skipped = True
                    continue
                overridden.append((sampler, sampler.even_batches))
                sampler.even_batches = even_batches
            if skipped:
                warnings.warn(
                    "Overriding even_batches is only supported for map-style datasets, but some prepared loaders "
                    "read iterable data; they keep their setting.",
                    UserWarning,
                    stacklevel=3,
                )
        try:
            with self.strategy.join(joinables, enable=not even_batches) or nullcontext():
                yield
        finally:
            for sampler, value in overridden:
                sampler.even_batches = value

    # -- triggers ---------------------------------------------------------------------------
    def set_trigger(self) -> None:
        """Raise this process's flag; :meth:`check_trigger` then returns True on every process."""
        self._trigger = True

    # -- preemption -------------------------------------------------------------------------
    def handle_preemption(self, signals: Iterable[int] | None = None) -> None:
        """Opt in to preemption handling: a stop signal on any process makes :meth:`check_preemption` true on all.

        Without this call nothing changes (no handler, no thread, no cost). After it, call
        :meth:`check_preemption` once per step on every process; it turns true on every process at
        the same step after a stop signal reached any of them (no collective per step: see
        :mod:`drivetrain.strategies.preemption`). Then save and end the run::

            accelerator.handle_preemption()
            for batch in loader:
                ...
                optimizer.step()
                if accelerator.check_preemption():
                    accelerator.save_state()  # automatic naming: load_state() resumes from the newest
                    accelerator.end_preempted()

        Args:
            signals: the signals that stop the run; by default ``SIGTERM`` and the cluster
                environment's requeue signal (``SLURMEnvironment(auto_requeue=True)``: ``SIGUSR1``).

        Raises:
            RuntimeError: called twice, or outside the main thread (where signal handlers run).
            ValueError: ``signals`` holds something that is not a signal a process can handle.
        """
        import signal

        self._require_processes("handle_preemption")
        if self._preemption is not None:
            raise RuntimeError("handle_preemption() was already called for this Accelerator; call it once.")
        if signals is None:
            environment = getattr(self.strategy, "cluster_environment", None)
            requeue = environment.requeue_signal if environment is not None else None
            chosen: tuple[int, ...] = (signal.SIGTERM,) if requeue is None else (signal.SIGTERM, requeue)
        else:
            chosen = tuple(signals)
            valid = set(signal.valid_signals()) - {signal.SIGKILL, signal.SIGSTOP}
            wrong = [s for s in chosen if isinstance(s, bool) or not isinstance(s, int) or s not in valid]
            if wrong or not chosen:
                raise ValueError(
                    f"handle_preemption(signals={signals!r}): give signals a process can handle, e.g. "
                    f"(signal.SIGTERM, signal.SIGUSR1); SIGKILL and SIGSTOP cannot be caught."
                )
        # The watch lives in the signal table (and in the exit handlers): it must not keep the
        # Accelerator, with its model and optimizer, alive after the user lets it go.
        watch = self.strategy.preemption_watch(chosen, functools.partial(_checks_made, weakref.ref(self)))
        if not watch.can_agree:
            raise RuntimeError(
                f"handle_preemption() needs the ranks to agree on a stop step through the rendezvous store, and "
                f"{type(self.strategy).__name__} has none; preemption is not supported with it."
            )
        if not watch.install():
            raise RuntimeError(
                "handle_preemption() must be called from the main thread: signal handlers run only there."
            )
        self._preemption = watch
        # Uninstalled when this Accelerator goes or at exit, whichever comes first: a signal that came
        # after the last check is not swallowed, and no handler outlives the run it was for.
        weakref.finalize(self, watch.uninstall)

    def check_preemption(self) -> bool:
        """Whether the run stops here for a stop signal: the same answer on every process, at the same call.

        Call it at the same point of every step on every process, after :meth:`handle_preemption`.
        Until a signal arrives it only reads a flag.
        """
        watch = self._preemption
        if watch is None:
            raise RuntimeError(
                "check_preemption() needs handle_preemption() first, which installs the signal handlers."
            )
        self._preemption_checks += 1
        return watch.pending and watch.stop_here()

    def end_preempted(self, checkpoint: str | None = None) -> NoReturn:
        """End the program after :meth:`check_preemption` stopped the run (and the state was saved).

        On the main process the job is requeued when the signal was the cluster environment's
        requeue signal (``scontrol requeue`` under SLURM). Raises
        :class:`~drivetrain.strategies.preemption.Preempted`, a ``SystemExit`` with code
        ``128 + signal`` (143 for ``SIGTERM``).

        Args:
            checkpoint: where the state was saved, for the message.
        """
        from drivetrain.strategies.preemption import Preempted

        watch = self._preemption
        if watch is None or not watch.stopping or watch.signum is None:
            raise RuntimeError(
                "end_preempted() ends a run that check_preemption() stopped; it has not (call it only after "
                "check_preemption() returned True)."
            )
        environment = getattr(self.strategy, "cluster_environment", None)
        if environment is not None and environment.requeue_signal == watch.signum and self.is_main_process:
            environment.requeue()
        raise Preempted(watch.signum, checkpoint)

    def check_trigger(self) -> bool:
        """Whether any process called :meth:`set_trigger` since the last check (a collective call)."""
        self._require_processes("check_trigger")
        fired = self.strategy.reduce_boolean_decision(self._trigger, all=False)
        if fired:
            self._trigger = False
        return fired


def _checks_made(owner: weakref.ref[ProcessControl]) -> int:
    """How many times ``owner`` called ``check_preemption()`` (0 once it is gone)."""
    alive = owner()
    return alive._preemption_checks if alive is not None else 0


def _uneven_shares(loader: Any) -> bool:
    """Whether ``loader`` deals batches with ``even_batches=False``; a ``ValueError`` when the processes'
    batch counts differ (each would make a different number of gathers: the longer ones would wait
    forever in their last)."""
    sharding = loader.batch_sampler
    if getattr(sharding, "even_batches", True) or not callable(
        getattr(sharding, "batches_per_process", None)
    ):
        return False
    try:
        counts = sharding.batches_per_process()
    except TypeError:  # a batch sampler without a length: nothing to compare
        return True
    if len(set(counts)) > 1:
        described = ", ".join(f"rank {rank}: {count}" for rank, count in enumerate(counts))
        raise ValueError(
            f"gather_for_metrics in a loop over a loader prepared with even_batches=False, which gives the processes "
            f"different numbers of batches ({described}): a process with more batches would wait forever in its "
            f"last gather. Use even_batches=True (the default: the last round is completed with repeated items, "
            f"which gather_for_metrics drops), or collect the results in the loop and gather them once after it "
            f"(accelerator.gather_for_metrics(results, use_gather_object=True))."
        )
    return True
