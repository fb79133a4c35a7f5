"""Fully sharded data parallel on PyTorch's ``fully_shard`` (FSDP2).

Each rank holds 1/N of every parameter, gradient and optimizer state; a block's parameters
are all-gathered just before its forward (and backward) and freed after. Presets:
``strategy="fsdp"`` and ``strategy="fsdp_cpu_offload"``. Set-up order and the checkpoint
format are described in :mod:`drivetrain.strategies.fsdp_wrap` and
:mod:`drivetrain.strategies.fsdp_checkpoint`; ``docs/sharded-training.md`` has the user guide.

Example::

    strategy = drivetrain.connect(accelerator="cuda", strategy=FSDPStrategy(
        auto_wrap_policy={TransformerBlock}, activation_checkpointing_policy={TransformerBlock}),
        devices=8, precision="bf16-mixed")
"""

from __future__ import annotations

import warnings
import weakref
from collections.abc import Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any, Unpack

import torch
from torch import nn
from torch.optim import Optimizer

from drivetrain._utilities import paths
from drivetrain.plugins.io.safe_loading import DamagedCheckpointError
from drivetrain.plugins.precision.fsdp import fsdp_mixed_precision_policy, fsdp_precision
from drivetrain.strategies.consolidate import consolidate_checkpoint
from drivetrain.strategies.fsdp_wrap import (
    ModulePolicy,
    apply_activation_checkpointing,
    has_meta_tensors,
    materialize_meta_module,
    parameter_names,
    policy_predicate,
    repoint_optimizers,
    shard_module,
)
from drivetrain.strategies.parallel import ParallelStrategy
from drivetrain.strategies.process_group_options import ProcessGroupArguments

if TYPE_CHECKING:
    from drivetrain.accelerators.accelerator import Accelerator
    from drivetrain.plugins.environments.cluster_environment import ClusterEnvironment
    from drivetrain.plugins.io.checkpoint_io import CheckpointIO
    from drivetrain.plugins.precision.precision import Precision

__all__ = ["FSDPStrategy", "consolidate_checkpoint"]

STATE_DICT_TYPES = ("sharded", "full")


class FSDPStrategy(ParallelStrategy):
    """Shard parameters, gradients and optimizer states across ranks with ``fully_shard``.

    Args:
        auto_wrap_policy: which blocks get their own all-gather group (bottom-up): a set of
            module classes (e.g. ``{TransformerBlock}``), a predicate ``module -> bool``, or a
            minimum parameter count. ``None`` shards the whole model as one group (simplest;
            the whole model is gathered at once in forward, so peak memory is higher).
        activation_checkpointing_policy: blocks whose activations are recomputed in backward
            instead of stored (module classes or a predicate).
        cpu_offload: keep the sharded parameters, gradients and optimizer state in CPU memory
            and step on the CPU (``CPUOffloadPolicy``).
        reshard_after_forward: free gathered parameters after forward (``True``, least memory),
            keep them until backward (``False``), or reshard to a smaller group of that many ranks.
        mixed_precision: a ``MixedPrecisionPolicy`` to use instead of the one derived from the
            precision (see :mod:`drivetrain.plugins.precision.fsdp`).
        state_dict_type: ``"sharded"`` (default): :meth:`save_state` writes a directory in which
            each rank writes its own shards; ``"full"``: rank 0 gathers everything into one file.
        **options: the process-group settings of every parallel strategy (``num_nodes``, ``start_method``,
            ``timeout`` …): :class:`~drivetrain.strategies.process_group_options.ProcessGroupArguments`.

    Raises:
        ValueError/TypeError: for arguments outside the documented values.
    """

    kind = "fsdp"

    def __init__(
        self,
        accelerator: Accelerator | None = None,
        parallel_devices: list[torch.device] | None = None,
        cluster_environment: ClusterEnvironment | None = None,
        checkpoint_io: CheckpointIO | None = None,
        precision: Precision | None = None,
        *,
        precision_plugin: Precision | None = None,
        auto_wrap_policy: ModulePolicy | int | None = None,
        activation_checkpointing_policy: ModulePolicy | None = None,
        cpu_offload: bool = False,
        reshard_after_forward: bool | int = True,
        mixed_precision: Any | None = None,
        state_dict_type: str = "sharded",
        **options: Unpack[ProcessGroupArguments],
    ) -> None:
        super().__init__(
            accelerator,
            parallel_devices,
            cluster_environment,
            checkpoint_io,
            precision,
            precision_plugin=precision_plugin,
            **options,
        )
        if state_dict_type not in STATE_DICT_TYPES:
            raise ValueError(
                f"state_dict_type={state_dict_type!r} is not supported; use 'sharded' (each rank writes its "
                f"shards, the default) or 'full' (rank 0 gathers one file)."
            )
        if not isinstance(cpu_offload, bool):
            raise TypeError(f"cpu_offload= expects True or False, got {cpu_offload!r}.")
        if isinstance(reshard_after_forward, int) and not isinstance(reshard_after_forward, bool):
            if reshard_after_forward < 2:
                raise ValueError(
                    f"reshard_after_forward={reshard_after_forward}: a number means 'reshard to groups of that "
                    f"many ranks' and must be at least 2 (a divisor of the world size); use True or False otherwise."
                )
        elif not isinstance(reshard_after_forward, bool):
            raise TypeError(
                f"reshard_after_forward= expects a bool or an int, got {reshard_after_forward!r}."
            )
        self._wrap_predicate = policy_predicate(auto_wrap_policy, "auto_wrap_policy", allow_count=True)
        checkpoint_predicate = policy_predicate(
            activation_checkpointing_policy, "activation_checkpointing_policy", allow_count=False
        )
        assert not isinstance(checkpoint_predicate, int)  # allow_count=False refuses counts
        self._checkpoint_predicate = checkpoint_predicate
        self._check_mixed_precision(mixed_precision)
        self.cpu_offload = cpu_offload
        self.reshard_after_forward = reshard_after_forward
        self.mixed_precision = mixed_precision
        self.state_dict_type = state_dict_type
        self._device_mesh: Any = None
        # Which module each set-up optimizer steps (DCP's optimizer state dicts are keyed by the
        # module's parameter names). Weak, so a dropped optimizer is not kept alive.
        self._optimizer_modules: weakref.WeakKeyDictionary[Optimizer, nn.Module] = weakref.WeakKeyDictionary()

    @staticmethod
    def _check_mixed_precision(policy: Any) -> None:
        if policy is None:
            return
        from torch.distributed.fsdp import MixedPrecisionPolicy

        if not isinstance(policy, MixedPrecisionPolicy):
            raise TypeError(
                f"mixed_precision= expects a torch.distributed.fsdp.MixedPrecisionPolicy, got {policy!r}. "
                f"Or leave it out and pass precision='bf16-mixed' (or another precision name)."
            )

    # -- connect()'s checks -----------------------------------------------------------------
    def connect_plugins(self, **plugins: Any) -> None:
        super().connect_plugins(**plugins)

        self._precision = fsdp_precision(self.precision)

    def check_accelerator(self, accelerator: Accelerator) -> None:
        """Refuse hardware FSDP2 cannot run on (XLA, MPS); warn where CPU offload would change nothing."""
        kind = type(accelerator).__name__
        if kind in ("XLAAccelerator", "MPSAccelerator"):
            hint = (
                "use strategy='xla'" if kind == "XLAAccelerator" else "use strategy='auto' (one MPS device)"
            )
            raise ValueError(
                f"FSDPStrategy cannot run on {kind}: fully_shard needs a process-group backend for the device "
                f"(CPU/gloo, CUDA/NCCL, XPU/XCCL). Use accelerator='cpu' or 'cuda', or {hint}."
            )
        if self.cpu_offload and kind == "CPUAccelerator":
            warnings.warn(
                "FSDPStrategy(cpu_offload=True) on the CPU accelerator changes nothing: the shards already live in "
                "CPU memory. Use strategy='fsdp' on CPU, or run on a GPU to offload.",
                UserWarning,
                stacklevel=4,
            )

    # -- set-up -----------------------------------------------------------------------------
    @property
    def requires_joint_setup(self) -> bool:
        return True

    @property
    def forward_is_collective(self) -> bool:
        """``True``: each forward all-gathers the sharded parameters."""
        return True

    @property
    def supports_inference_mode(self) -> bool:
        """``False``: ``fully_shard`` allocates the unsharded parameters during the first forward and
        reuses them in every later all-gather; made under inference mode (an evaluation before
        training), they could never be written again by a training step."""
        return False

    @property
    def device_mesh(self) -> Any:
        """The 1-D device mesh over all ranks that parameters are sharded on (made on first use)."""
        if self._device_mesh is None:
            from torch.distributed.device_mesh import init_device_mesh

            self._device_mesh = init_device_mesh(self.root_device.type, (self.world_size,))
        return self._device_mesh

    def module_init_context(self, empty_init: bool | None = None) -> AbstractContextManager[Any]:
        """Build on the meta device with ``empty_init=True`` (no memory; each rank later
        allocates only its shards), else on this rank's device."""
        if not empty_init:
            return super().module_init_context(empty_init)
        stack = ExitStack()
        stack.enter_context(torch.device("meta"))
        stack.enter_context(self.precision.module_init_context())
        return stack

    def module_to_device(self, module: nn.Module) -> None:
        """Nothing: ``fully_shard`` moves each rank's shards to the device itself (and leaves them in
        CPU memory under ``cpu_offload``); moving the whole model first would need it to fit, and a
        model built on the meta device cannot be moved at all."""

    def setup_module(self, module: nn.Module) -> nn.Module:
        """Shard ``module`` (in place) and return it; optimizers must then be built on its parameters."""
        self.model = self._shard(module)
        return self.model

    def setup_optimizer(self, optimizer: Optimizer) -> Optimizer:
        """Accept an optimizer built on an already sharded module's parameters."""
        self.module_for_optimizer(optimizer)
        return optimizer

    def setup_module_and_optimizers(
        self, module: nn.Module, optimizers: list[Optimizer]
    ) -> tuple[nn.Module, list[Optimizer]]:
        """Shard ``module`` and point ``optimizers`` (built on its unsharded parameters) at the shards."""
        names = parameter_names(module)
        sharded = self._shard(module)
        repoint_optimizers(optimizers, names, sharded)
        for optimizer in optimizers:
            self._optimizer_modules[optimizer] = sharded
        self.model = sharded
        return sharded, optimizers

    def _shard(self, module: nn.Module) -> nn.Module:
        from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, OffloadPolicy

        if isinstance(module, FSDPModule):
            return module
        module = self.precision.convert_module(module)
        policy = self.mixed_precision or fsdp_mixed_precision_policy(self.precision) or MixedPrecisionPolicy()
        offload = (
            CPUOffloadPolicy(pin_memory=self.root_device.type == "cuda")
            if self.cpu_offload
            else OffloadPolicy()
        )
        apply_activation_checkpointing(module, self._checkpoint_predicate)
        on_meta = has_meta_tensors(module)
        shard_module(
            module,
            self._wrap_predicate,
            {
                "mesh": self.device_mesh,
                "reshard_after_forward": self.reshard_after_forward,
                "mp_policy": policy,
                "offload_policy": offload,
            },
        )
        if on_meta:
            materialize_meta_module(module, torch.device("cpu") if self.cpu_offload else self.root_device)
        return module

    def module_for_optimizer(self, optimizer: Optimizer) -> nn.Module:
        """The set-up module whose parameters ``optimizer`` steps."""
        module = self._optimizer_modules.get(optimizer)
        if module is not None:
            return module
        if self.model is not None:
            owned = {id(p) for p in self.model.parameters()}
            if all(id(p) in owned for group in optimizer.param_groups for p in group["params"]):
                self._optimizer_modules[optimizer] = self.model
                return self.model
        raise ValueError(
            f"{type(optimizer).__name__} was not set up with a sharded module. Pass it to "
            f"setup_module_and_optimizers(module, [optimizer]) (or build it on the parameters of the module "
            f"returned by setup_module)."
        )

    # -- the per-step path ---------------------------------------------------------------------
    def no_backward_sync(self, module: nn.Module, enabled: bool = True) -> AbstractContextManager[Any]:
        """Accumulate unreduced gradients locally in backward passes inside this context."""
        if not enabled:
            return nullcontext()
        from torch.distributed.fsdp import FSDPModule

        if isinstance(module, FSDPModule):
            return _gradient_sync_off(module)
        # The module inside torch.compile's wrapper (Accelerator(dynamo_backend=...) returns that).
        inner = getattr(module, "_modules", {}).get("_orig_mod")
        if not isinstance(inner, FSDPModule):
            raise TypeError(
                f"no_backward_sync needs the module returned by FSDPStrategy.setup_module(...), got "
                f"{type(module).__name__}."
            )
        return _gradient_sync_off(inner)

    # -- state ---------------------------------------------------------------------------------
    def get_module_state_dict(self, module: nn.Module) -> dict[str, Any]:
        """The full state dict, gathered on CPU on global rank 0 (other ranks get ``{}``); every rank must call."""
        from torch.distributed.checkpoint.state_dict import get_model_state_dict

        if not _is_sharded(module):
            return super().get_module_state_dict(module)
        return get_model_state_dict(module, options=_full_options())

    def load_module_state_dict(
        self, module: nn.Module, state_dict: dict[str, Any], strict: bool = True
    ) -> None:
        """Load a full (unsharded) state dict, which every rank passes, into the sharded module."""
        from torch.distributed.checkpoint.state_dict import set_model_state_dict

        if not _is_sharded(module):
            return super().load_module_state_dict(module, state_dict, strict)
        set_model_state_dict(module, state_dict, options=_full_options(cpu_offload=False, strict=strict))

    def get_optimizer_state(self, optimizer: Optimizer) -> dict[str, Any]:
        """The full optimizer state keyed by parameter names, on rank 0 (``{}`` elsewhere)."""
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

        return get_optimizer_state_dict(
            self.module_for_optimizer(optimizer), optimizer, options=_full_options()
        )

    def load_optimizer_state(self, optimizer: Optimizer, state_dict: dict[str, Any]) -> None:
        from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

        module = self.module_for_optimizer(optimizer)
        set_optimizer_state_dict(module, optimizer, state_dict, options=_full_options(cpu_offload=False))

    def save_state(self, path: str | Path, state: dict[str, Any], storage_options: Any | None = None) -> None:
        """Save modules, optimizers and values: sharded into directory ``path`` (default), or, with
        ``state_dict_type="full"``, gathered by rank 0 into file ``path``. Every rank must call."""
        if storage_options is not None:
            raise TypeError(
                "FSDPStrategy.save_state does not take storage_options; sharded checkpoints are written "
                "through torch.distributed.checkpoint."
            )
        if self.state_dict_type == "full":
            super().save_state(path, state)
            self.barrier("fsdp_save_full")
            return
        from drivetrain.strategies.fsdp_checkpoint import save_sharded

        save_sharded(self, path, state)

    def load_state(
        self,
        path: str | Path,
        state: dict[str, Any] | None = None,
        strict: bool = True,
        *,
        weights_only: bool = True,
        map_location: Any | None = None,
    ) -> dict[str, Any]:
        """Load a sharded directory or a full file (whichever ``path`` is) into the live objects of ``state``.

        A sharded directory is read straight into the live shards, wherever they are, so
        ``map_location`` applies to a full file only.
        """
        from drivetrain.strategies.fsdp_checkpoint import is_sharded_checkpoint, load_sharded, lost_its_index

        state = state if state is not None else {}
        if is_sharded_checkpoint(path):
            return load_sharded(self, path, state, strict, weights_only)
        if lost_its_index(path):
            raise DamagedCheckpointError(path, "its index of the shards (DCP's .metadata) is missing")
        if Path(path).is_dir():
            raise ValueError(
                f"{path} is a directory but not a sharded checkpoint (no DCP .metadata inside). Pass the directory "
                f"FSDPStrategy.save_state wrote, or a full checkpoint file."
            )
        return super().load_state(path, state, strict, weights_only=weights_only, map_location=map_location)

    def reads_checkpoint_whole(self, path: str | Path) -> bool:
        """A full-state file is read as one dict; a sharded directory straight into the live shards."""
        from drivetrain.strategies.fsdp_checkpoint import is_sharded_checkpoint

        return not is_sharded_checkpoint(path) and not paths.isdir(path)

    @classmethod
    def register_strategies(cls, strategy_registry: Any) -> None:
        strategy_registry.register(
            "fsdp", cls, description="Fully sharded data parallel (FSDP2 fully_shard), sharded checkpoints."
        )
        strategy_registry.register(
            "fsdp_cpu_offload",
            cls,
            description="FSDP with parameters, gradients and optimizer state offloaded to CPU memory.",
            cpu_offload=True,
        )

    def __repr__(self) -> str:
        return (
            f"FSDPStrategy(devices={self._parallel_devices if self._parallel_devices is not None else 'unset'}, "
            f"cpu_offload={self.cpu_offload}, state_dict_type={self.state_dict_type!r}, "
            f"precision={self._precision!r})"
        )


def _is_sharded(module: nn.Module) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(module, FSDPModule)


def _full_options(cpu_offload: bool = True, strict: bool = True) -> Any:
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=True, cpu_offload=cpu_offload, strict=strict)


@contextmanager
def _gradient_sync_off(module: Any) -> Iterator[None]:
    module.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        module.set_requires_gradient_sync(True)
