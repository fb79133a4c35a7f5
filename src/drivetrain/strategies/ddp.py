"""Distributed data parallel: one process per device, gradients averaged in the backward pass."""

from __future__ import annotations

import inspect
import weakref
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from functools import lru_cache
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from drivetrain.strategies.parallel import ParallelStrategy
from drivetrain.strategies.process_group_options import split_process_group_arguments

if TYPE_CHECKING:
    from drivetrain.accelerators.accelerator import Accelerator
    from drivetrain.plugins.environments.cluster_environment import ClusterEnvironment
    from drivetrain.plugins.io.checkpoint_io import CheckpointIO
    from drivetrain.plugins.precision.precision import Precision


class DDPStrategy(ParallelStrategy):
    """Wrap the model in :class:`~torch.nn.parallel.DistributedDataParallel`.

    Args:
        **kwargs: the process-group settings of every parallel strategy (``num_nodes``,
            ``start_method``, ``timeout`` …: :class:`~drivetrain.strategies.process_group_options.ProcessGroupArguments`;
            ``start_method="popen"``, the default, re-runs the script once per extra local rank as
            torchrun would), and anything else for ``DistributedDataParallel``
            (``static_graph=True``, ``find_unused_parameters=True`` …); unknown names are an error.

    Override :meth:`configure_ddp` to wrap the model differently; it finds the module in
    ``self.model`` and must leave the wrapped module there.
    """

    kind = "ddp"
    wraps_models = True

    def __init__(
        self,
        accelerator: Accelerator | None = None,
        parallel_devices: list[torch.device] | None = None,
        cluster_environment: ClusterEnvironment | None = None,
        checkpoint_io: CheckpointIO | None = None,
        precision: Precision | None = None,
        *,
        precision_plugin: Precision | None = None,
        **kwargs: Any,
    ) -> None:
        options, ddp_kwargs = split_process_group_arguments(kwargs)
        super().__init__(
            accelerator,
            parallel_devices,
            cluster_environment,
            checkpoint_io,
            precision,
            precision_plugin=precision_plugin,
            **options,
        )
        unknown = sorted(set(ddp_kwargs) - _ddp_parameters())
        if unknown:
            raise TypeError(
                f"DDPStrategy got unknown argument(s) {', '.join(map(repr, unknown))}. Keyword arguments beyond "
                f"the strategy's own are passed to torch's DistributedDataParallel, which accepts: "
                f"{', '.join(sorted(_ddp_parameters()))}."
            )
        self._ddp_kwargs = ddp_kwargs
        self._wrapped: weakref.WeakSet[nn.Module] = weakref.WeakSet()

    @property
    def ddp_kwargs(self) -> dict[str, Any]:
        return dict(self._ddp_kwargs)

    def _device_ids(self) -> list[int] | None:
        device = self.root_device
        return [device.index if device.index is not None else 0] if device.type in ("cuda", "xpu") else None

    def configure_ddp(self) -> None:
        """Wrap ``self.model`` in ``DistributedDataParallel`` (override to customise the wrapper)."""
        assert self.model is not None
        self.model = DistributedDataParallel(self.model, device_ids=self._device_ids(), **self._ddp_kwargs)

    def setup_module(self, module: nn.Module) -> nn.Module:
        self.model = module
        self.configure_ddp()
        assert self.model is not None, "configure_ddp() must leave the wrapped module in self.model"
        self._wrapped.add(self.model)
        return self.model

    def __getstate__(self) -> dict[str, Any]:
        # Spawned ranks get a copy of the strategy; the modules it wrapped here stay here.
        state = super().__getstate__()
        state["_wrapped"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._wrapped = weakref.WeakSet()

    def release_communication_state(self) -> None:
        # A DDP reducer that outlives its process group makes the interpreter abort at exit
        # ("terminate called without an active exception") in a few percent of runs.
        for module in list(self._wrapped):
            if hasattr(module, "reducer"):
                del module.reducer
        self._wrapped.clear()

    @contextmanager
    def force_backward_sync(self, module: nn.Module) -> Iterator[None]:
        """The next backward pass all-reduces ``module``'s gradients, even inside :meth:`no_backward_sync`."""
        ddp = module if isinstance(module, DistributedDataParallel) else _compiled_ddp(module)
        if not isinstance(ddp, DistributedDataParallel):
            yield
            return
        saved = (ddp.require_backward_grad_sync, ddp.require_forward_param_sync)
        ddp.require_backward_grad_sync = ddp.require_forward_param_sync = True
        ddp.reducer.prepare_for_backward([])
        try:
            yield
        finally:
            ddp.require_backward_grad_sync, ddp.require_forward_param_sync = saved

    def join(self, joinables: Sequence[Any], enable: bool = True) -> AbstractContextManager[Any] | None:
        """torch's ``Join`` over ``joinables`` (DDP modules, ``ZeroRedundancyOptimizer``): a process whose
        data ran out keeps shadowing the others' all-reduces until every process is done."""
        from torch.distributed.algorithms.join import Join

        return Join(list(joinables), enable=enable, throw_on_early_termination=False)

    def no_backward_sync(self, module: nn.Module, enabled: bool = True) -> AbstractContextManager[Any]:
        if enabled and isinstance(module, DistributedDataParallel):
            return module.no_sync()
        inner = _compiled_ddp(module) if enabled else None
        if isinstance(inner, DistributedDataParallel):
            return inner.no_sync()
        return nullcontext()

    @classmethod
    def register_strategies(cls, strategy_registry: Any) -> None:
        # Each way of starting processes, plain and with find_unused_parameters set either way:
        # the same twelve names Lightning registers.
        start_methods: list[tuple[str, str, dict[str, Any]]] = [
            ("ddp", "One process per device, started by re-running the script (like torchrun).", {}),
            (
                "ddp_spawn",
                "DDP with processes started by torch.multiprocessing spawn.",
                {"start_method": "spawn"},
            ),
            (
                "ddp_fork",
                "DDP with forked processes (no pickling; not after CUDA is initialised).",
                {"start_method": "fork"},
            ),
            (
                "ddp_notebook",
                "DDP with forked processes, for notebooks and other interactive sessions.",
                {"start_method": "fork"},
            ),
        ]
        for base, description, kwargs in start_methods:
            strategy_registry.register(base, cls, description=description, **kwargs)
            for unused in (True, False):
                what = (
                    "tolerates parameters unused in a step"
                    if unused
                    else "expects every parameter to get a gradient"
                )
                strategy_registry.register(
                    f"{base}_find_unused_parameters_{str(unused).lower()}",
                    cls,
                    description=f"{base!r} that {what}.",
                    **kwargs,
                    find_unused_parameters=unused,
                )


def _compiled_ddp(module: nn.Module) -> nn.Module | None:
    """The DDP module inside ``torch.compile``'s wrapper (what ``Accelerator(dynamo_backend=...)`` returns).

    DDP's forward runs outside the compiled graphs, so its ``no_sync`` flags still take effect.
    """
    inner = getattr(module, "_modules", {}).get("_orig_mod")
    return inner if isinstance(inner, DistributedDataParallel) else None


@lru_cache(maxsize=1)
def _ddp_parameters() -> frozenset[str]:
    names = set(inspect.signature(DistributedDataParallel.__init__).parameters)
    return frozenset(names - {"self", "module", "device_ids", "output_device"})
