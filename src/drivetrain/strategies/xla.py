"""Data-parallel training on XLA devices (TPUs) through ``torch_xla``.

One process per XLA device, started by ``torch_xla``'s own multiprocessing; gradients are
all-reduced at the optimizer step (``xm.reduce_gradients``), so accumulation needs no
``no_sync``. ``torch_xla`` is imported only inside methods: it is optional and cannot be
installed next to every torch (it cannot run on our CPU CI, where it is exercised through a
stand-in package with the same functions).
"""

from __future__ import annotations

import io
import os
import pickle
import tempfile
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn
from torch.optim import Optimizer

from drivetrain._utilities.apply import move_to_device
from drivetrain.strategies.launchers.launcher import Launcher
from drivetrain.strategies.parallel import ParallelStrategy
from drivetrain.strategies.strategy import _check_reduce_op

if TYPE_CHECKING:
    from drivetrain.accelerators.accelerator import Accelerator
    from drivetrain.plugins.io.checkpoint_io import CheckpointIO
    from drivetrain.plugins.precision.precision import Precision


class XLAStrategy(ParallelStrategy):
    """One process per XLA device.

    Args:
        sync_module_states: broadcast rank 0's parameters to every rank when a module is set up.
        debug: turn on ``torch_xla``'s debug output (``PT_XLA_DEBUG_LEVEL``) in the worker processes.
    """

    kind = "xla"

    def __init__(
        self,
        accelerator: Accelerator | None = None,
        parallel_devices: list[torch.device] | None = None,
        checkpoint_io: CheckpointIO | None = None,
        precision: Precision | None = None,
        *,
        precision_plugin: Precision | None = None,
        sync_module_states: bool = True,
        debug: bool = False,
    ) -> None:
        super().__init__(
            accelerator, parallel_devices, None, checkpoint_io, precision, precision_plugin=precision_plugin
        )
        self._sync_module_states = sync_module_states
        self._debug = debug
        self._launched = False

    def check_accelerator(self, accelerator: Accelerator) -> None:
        from drivetrain.accelerators.xla import XLAAccelerator

        if not isinstance(accelerator, XLAAccelerator):
            raise ValueError(
                f"strategy='xla' runs on XLA devices only, but the accelerator is {type(accelerator).__name__}. "
                f"Use accelerator='xla' (or 'tpu'), or a strategy such as 'ddp' for this hardware."
            )

    # -- ranks come from the XLA runtime once the processes run ------------------------------
    @property
    def world_size(self) -> int:
        return _runtime().world_size() if self._launched else 1

    @property
    def global_rank(self) -> int:
        return _runtime().global_ordinal() if self._launched else 0

    @property
    def local_rank(self) -> int:
        return _runtime().local_ordinal() if self._launched else 0

    @property
    def node_rank(self) -> int:
        return 0

    def set_world_ranks(self) -> None:
        """The XLA runtime knows the ranks; there is nothing to tell a cluster environment."""

    @property
    def root_device(self) -> torch.device:
        if not self._launched:
            return self.parallel_devices[0]
        import torch_xla.core.xla_model as xm

        return torch.device(xm.xla_device())

    @property
    def launcher(self) -> Launcher | None:
        return _XLALauncher(self) if self.num_processes > 1 else None

    # -- set-up ----------------------------------------------------------------------------------
    def setup_environment(self) -> None:
        self._launched = True
        if self._debug:
            os.environ.setdefault("PT_XLA_DEBUG_LEVEL", "1")
        self.accelerator.setup_device(self.root_device)
        if self.num_processes > 1:
            import torch.distributed as dist
            import torch_xla.distributed.xla_backend  # noqa: F401 - registers the "xla" backend

            if not dist.is_initialized():
                dist.init_process_group("xla", init_method="xla://")
                self._owns_process_group = True

    def setup_module(self, module: nn.Module) -> nn.Module:
        self.model = module
        if self._sync_module_states and self.num_processes > 1:
            import torch_xla.core.xla_model as xm

            xm.broadcast_master_param(module)
        return module

    def optimizer_step(
        self,
        optimizer: Optimizer,
        closure: Callable[[], Any] | None = None,
        model: nn.Module | None = None,
        **kwargs: Any,
    ) -> Any:
        import torch_xla.core.xla_model as xm

        xm.reduce_gradients(optimizer)
        result = self.precision.optimizer_step(optimizer, closure, **kwargs)
        xm.mark_step()
        return result

    # -- collectives through the XLA runtime -------------------------------------------------
    def all_reduce(self, tensor: Tensor, group: Any | None = None, reduce_op: str = "mean") -> Tensor:
        _check_reduce_op(reduce_op)
        if self.world_size == 1:
            return tensor
        import torch_xla.core.xla_model as xm

        op = {
            "sum": xm.REDUCE_SUM,
            "mean": xm.REDUCE_SUM,
            "max": xm.REDUCE_MAX,
            "min": xm.REDUCE_MIN,
            "product": xm.REDUCE_MUL,
        }[reduce_op]
        result = xm.all_reduce(op, tensor.to(self.root_device))
        return result / self.world_size if reduce_op == "mean" else result

    def all_gather(self, tensor: Tensor, group: Any | None = None, sync_grads: bool = False) -> Tensor:
        if self.world_size == 1:
            return tensor.unsqueeze(0)
        import torch_xla.core.xla_model as xm

        return xm.all_gather(tensor.unsqueeze(0).to(self.root_device), dim=0)

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        if self.world_size == 1:
            return obj
        import torch_xla.core.xla_model as xm

        buffer = io.BytesIO()
        pickle.dump(obj, buffer)
        data = torch.frombuffer(bytearray(buffer.getvalue()), dtype=torch.uint8).to(self.root_device)
        size = xm.all_reduce(xm.REDUCE_MAX, torch.tensor([data.numel()], device=self.root_device))
        padded = torch.zeros(int(size.item()), dtype=torch.uint8, device=self.root_device)
        padded[: data.numel()] = data
        xm.collective_broadcast([padded], root_ordinal=src)
        return pickle.loads(padded.cpu().numpy().tobytes())

    def all_gather_object(self, obj: Any) -> list[Any]:
        return [self.broadcast(obj, src=rank) for rank in range(self.world_size)]

    def barrier(self, name: str | None = None) -> None:
        if self.world_size == 1:
            return
        import torch_xla.core.xla_model as xm

        xm.rendezvous(name or "drivetrain-barrier")

    def reduce_boolean_decision(self, decision: bool, all: bool = True) -> bool:
        votes = self.all_reduce(torch.tensor(int(bool(decision))), reduce_op="sum")
        count = int(votes.item())
        return count == self.world_size if all else count > 0

    def teardown(self) -> None:
        self._launched = False
        super().teardown()

    @classmethod
    def register_strategies(cls, strategy_registry: Any) -> None:
        strategy_registry.register(
            "xla", cls, description="One process per XLA device (TPU cores) via torch_xla."
        )
        strategy_registry.register(
            "xla_debug", cls, description="'xla' with torch_xla's debug output.", debug=True
        )


class _XLALauncher(Launcher):
    """Starts one process per XLA device with ``torch_xla``'s multiprocessing."""

    def __init__(self, strategy: XLAStrategy) -> None:
        self._strategy = strategy

    @property
    def is_interactive_compatible(self) -> bool:
        return True

    def launch(self, function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        import torch_xla.distributed.xla_multiprocessing as xmp

        # The ranks are forked: rank 0 hands its result back through a file.
        with tempfile.TemporaryDirectory(prefix="drivetrain-xla-") as scratch:
            path = os.path.join(scratch, "rank0-result.pkl")

            def run(index: int) -> None:
                result = function(*args, **kwargs)
                if self._strategy.global_rank == 0:
                    with open(path, "wb") as file:
                        pickle.dump(move_to_device(result, "cpu"), file)

            xmp.spawn(run, nprocs=None, start_method="fork")
            if not os.path.exists(path):
                return None
            with open(path, "rb") as file:
                return pickle.load(file)


def _runtime() -> Any:
    import torch_xla.runtime as xr

    return xr
