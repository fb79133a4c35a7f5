"""N-D parallelism on one torch ``DeviceMesh``: FSDP2 x tensor parallel x HSDP (x context parallel on CUDA).

``strategy="model_parallel"`` (or a :class:`ModelParallelStrategy`) builds the mesh of a
:class:`~drivetrain.strategies.layout.ParallelLayout` when the processes start, before the
model is set up. Then, in a fixed order (torchtitan's), each step a torch function:

1. tensor parallel: the user's ``configure_model`` calls ``parallelize_module`` on
   ``self.device_mesh["tensor_parallel"]`` (Trainer, as in Lightning), or the strategy applies
   its ``tp_plan`` (the Accelerator's ``prepare``); every split is checked to be even;
2. activation checkpointing of the blocks ``activation_checkpointing_policy`` picks;
3. data parallel: ``fully_shard`` over the ``dp_shard`` ranks (2-D ``dp_replicate x dp_shard``
   mesh: HSDP), block by block as ``auto_wrap_policy`` says, unless ``configure_model`` already
   did it;
4. a model built on the meta device gets its shards allocated and initialised.

Data is shared over the data-parallel ranks only (``distributed_sampler_kwargs``): the ranks of
one tensor- or context-parallel group read the same batches. Checkpoints are FSDP's
(:mod:`drivetrain.strategies.fsdp_checkpoint`): DCP writes each rank's DTensor shards, and
loading on another layout or world size re-shards.

Example (Trainer, as in Lightning)::

    class GPT(dt.TrainingModule):
        def configure_model(self):
            parallelize_module(self.model, self.device_mesh["tensor_parallel"], plan)

    dt.Trainer(strategy=ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=2), devices=4)
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import TYPE_CHECKING, Any, Unpack

import torch
from torch import nn

from drivetrain.plugins.precision.fsdp import fsdp_mixed_precision_policy
from drivetrain.strategies.fsdp import FSDPStrategy
from drivetrain.strategies.fsdp_wrap import (
    ModulePolicy,
    apply_activation_checkpointing,
    has_meta_tensors,
    materialize_meta_module,
    shard_module,
)
from drivetrain.strategies.layout import AUTO, ParallelLayout
from drivetrain.strategies.process_group_options import ProcessGroupArguments

if TYPE_CHECKING:
    from drivetrain.accelerators.accelerator import Accelerator
    from drivetrain.plugins.environments.cluster_environment import ClusterEnvironment
    from drivetrain.plugins.io.checkpoint_io import CheckpointIO
    from drivetrain.plugins.precision.precision import Precision

__all__ = ["ModelParallelStrategy"]


class ModelParallelStrategy(FSDPStrategy):
    """Tensor parallel and FSDP2 (HSDP when replicated) on one named ``DeviceMesh``.

    Args:
        data_parallel_size: ranks that shard the model and read different data (Lightning's
            name; the layout's ``dp_shard``). ``"auto"``: the number of nodes while
            ``tensor_parallel_size`` is ``"auto"`` too (as Lightning), else inferred.
        tensor_parallel_size: ranks of one tensor-parallel group. ``"auto"``: the processes per
            node while ``data_parallel_size`` is ``"auto"`` too (as Lightning), else inferred.
        layout: the full :class:`~drivetrain.strategies.layout.ParallelLayout` (``dp_replicate``,
            ``dp_shard``, ``tp``, ``cp``) instead of the two sizes above.
        tp_plan: a ``parallelize_module`` plan (module path -> ``ParallelStyle`` or
            ``"colwise"``/``"rowwise"``/``"sequence_parallel"``) the strategy applies to the
            model it sets up; leave it out when ``configure_model`` applies tensor parallelism.
        save_distributed_checkpoint: each rank writes its shards (``True``, Lightning's default)
            or rank 0 gathers one file (``False``).
        auto_wrap_policy: as for :class:`~drivetrain.strategies.FSDPStrategy`.
        activation_checkpointing_policy: as for :class:`~drivetrain.strategies.FSDPStrategy`.
        reshard_after_forward: as for :class:`~drivetrain.strategies.FSDPStrategy`.
        mixed_precision: as for :class:`~drivetrain.strategies.FSDPStrategy`.

    The other arguments (the plugins, ``parallel_devices``, ``num_nodes``, ``start_method``,
    ``process_group_backend``, ``timeout`` …) are as for :class:`~drivetrain.strategies.FSDPStrategy`.

    Raises:
        TypeError/ValueError: bad sizes or plan here; a layout that does not fit the job (sizes
            not multiplying to the world size, ``cp`` off CUDA) when the strategy is connected.
    """

    kind = "model_parallel"
    compiles_models = False  # tensor-parallel layouts are untested under a compiled wrapper

    def __init__(
        self,
        data_parallel_size: int | str = AUTO,
        tensor_parallel_size: int | str = AUTO,
        *,
        layout: ParallelLayout | None = None,
        tp_plan: Mapping[str, Any] | None = None,
        save_distributed_checkpoint: bool = True,
        accelerator: Accelerator | None = None,
        parallel_devices: list[torch.device] | None = None,
        cluster_environment: ClusterEnvironment | None = None,
        checkpoint_io: CheckpointIO | None = None,
        precision: Precision | None = None,
        precision_plugin: Precision | None = None,
        auto_wrap_policy: ModulePolicy | int | None = None,
        activation_checkpointing_policy: ModulePolicy | None = None,
        reshard_after_forward: bool | int = True,
        mixed_precision: Any | None = None,
        **options: Unpack[ProcessGroupArguments],
    ) -> None:
        if not isinstance(save_distributed_checkpoint, bool):
            raise TypeError(
                f"save_distributed_checkpoint= expects True or False, got {save_distributed_checkpoint!r}."
            )
        super().__init__(
            accelerator,
            parallel_devices,
            cluster_environment,
            checkpoint_io,
            precision,
            precision_plugin=precision_plugin,
            auto_wrap_policy=auto_wrap_policy,
            activation_checkpointing_policy=activation_checkpointing_policy,
            reshard_after_forward=reshard_after_forward,
            mixed_precision=mixed_precision,
            state_dict_type="sharded" if save_distributed_checkpoint else "full",
            **options,
        )
        # None: Lightning's "auto" for both sizes, resolved once the devices and nodes are known.
        self._requested: ParallelLayout | None = None
        if layout is not None:
            if not isinstance(layout, ParallelLayout):
                raise TypeError(
                    f"layout= expects a drivetrain ParallelLayout, got {type(layout).__name__}. For Accelerate's "
                    f"ParallelismConfig, pass config.to_layout() (or give it to Accelerator(parallelism_config=...))."
                )
            if (data_parallel_size, tensor_parallel_size) != (AUTO, AUTO):
                raise ValueError(
                    f"ModelParallelStrategy got layout={layout!r} and data_parallel_size={data_parallel_size!r}/"
                    f"tensor_parallel_size={tensor_parallel_size!r}; they set the same sizes. Give only the layout."
                )
            self._requested = layout
        elif (data_parallel_size, tensor_parallel_size) != (AUTO, AUTO):
            self._requested = ParallelLayout(dp_shard=data_parallel_size, tp=tensor_parallel_size)
        if tp_plan is not None:
            from drivetrain.strategies.tensor_parallel import resolve_plan

            tp_plan = resolve_plan(tp_plan)
        self.tp_plan: dict[str, Any] | None = tp_plan
        self._layout: ParallelLayout | None = None

    # -- the layout --------------------------------------------------------------------------
    def connect_plugins(self, **plugins: Any) -> None:
        super().connect_plugins(**plugins)
        requested = self._requested or ParallelLayout(dp_shard=self.num_nodes, tp=self.num_processes)
        layout = requested.resolve(self.world_size)
        layout.check_device(self.parallel_devices[0].type)
        self._layout = layout

    @property
    def layout(self) -> ParallelLayout:
        """The resolved layout of this job (known once the strategy is connected)."""
        if self._layout is None:
            raise RuntimeError(
                "ModelParallelStrategy has no layout yet: it is resolved against the world size when the strategy is "
                "connected (Trainer(...), Accelerator(...) or drivetrain.connect(...))."
            )
        return self._layout

    @property
    def layout_mesh(self) -> Any:
        """:attr:`device_mesh`: the layout's named mesh (see :class:`~drivetrain.strategies.capabilities.StrategyCapabilities`)."""
        return self.device_mesh

    @property
    def device_mesh(self) -> Any:
        """The job's ``DeviceMesh``: Lightning's ``("data_parallel", "tensor_parallel")``, or, with
        replication or context parallelism, ``("dp_replicate", "dp_shard", "context_parallel",
        "tensor_parallel")`` (see :mod:`drivetrain.strategies.layout`).

        ``self.device_mesh["tensor_parallel"]`` in ``configure_model`` is the mesh to give
        ``parallelize_module``; ``strategy.layout.submesh("data_parallel")`` spans the ranks that
        read different data under every layout.
        """
        return self.layout.build_mesh(self.root_device.type)

    @property
    def distributed_sampler_kwargs(self) -> dict[str, int]:
        """Share the data over the data-parallel ranks only: tensor/context-parallel peers read the same batches."""
        layout = self.layout
        return {
            "num_replicas": layout.data_parallel_size,
            "rank": layout.data_parallel_rank(self.global_rank),
        }

    def setup_environment(self) -> None:
        super().setup_environment()
        self.layout.build_mesh(self.root_device.type)  # before configure_model(), which uses it

    # -- set-up --------------------------------------------------------------------------------
    def _shard(self, module: nn.Module) -> nn.Module:
        from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, OffloadPolicy

        from drivetrain.strategies.tensor_parallel import (
            apply_plan,
            check_even_split,
            has_tensor_parallel_parameters,
        )

        layout = self.layout
        tp = int(layout.tp)
        module = self.precision.convert_module(module)
        if self.tp_plan is not None and not has_tensor_parallel_parameters(module):
            if tp == 1:
                raise ValueError(
                    "ModelParallelStrategy got a tp_plan, but the layout has tp=1: the plan would split nothing. "
                    "Set the tensor-parallel size (tensor_parallel_size=, tp_size=) or leave tp_plan out."
                )
            apply_plan(module, layout.submesh("tensor_parallel"), self.tp_plan)
        if tp > 1 and not has_tensor_parallel_parameters(module):
            raise ValueError(
                f"The layout has tp={tp}, but {type(module).__name__} has no tensor-parallel parameters: each of the "
                f"{tp} ranks of a group would compute the same thing. Split layers with parallelize_module(module, "
                f"self.device_mesh['tensor_parallel'], plan) in configure_model(), or pass tp_plan=, or use tp=1."
            )
        check_even_split(module, tp)
        apply_activation_checkpointing(module, self._checkpoint_predicate)
        on_meta = has_meta_tensors(module)
        shards = layout.data_parallel_size * int(layout.cp) > 1
        # Lightning's pattern: configure_model() applied fully_shard itself (to blocks, then the model).
        sharded_by_user = any(isinstance(m, FSDPModule) for m in module.modules())
        if shards and sharded_by_user:
            _check_data_parallel_coverage(module)
        elif shards:
            policy = (
                self.mixed_precision or fsdp_mixed_precision_policy(self.precision) or MixedPrecisionPolicy()
            )
            offload = (
                CPUOffloadPolicy(pin_memory=self.root_device.type == "cuda")
                if self.cpu_offload
                else OffloadPolicy()
            )
            shard_module(
                module,
                self._wrap_predicate,
                {
                    "mesh": layout.fsdp_mesh(),
                    "reshard_after_forward": self.reshard_after_forward,
                    "mp_policy": policy,
                    "offload_policy": offload,
                },
            )
        elif not shards and not on_meta and self.root_device.type != "cpu":
            module.to(self.root_device)  # tensor parallel alone places only the layers it split
        if on_meta:
            materialize_meta_module(module, self.root_device)
        return module

    # -- the per-step path ---------------------------------------------------------------------
    def no_backward_sync(self, module: nn.Module, enabled: bool = True) -> AbstractContextManager[Any]:
        """FSDP's local accumulation; nothing for tensor parallel alone, whose reductions are part of the maths."""
        from torch.distributed.fsdp import FSDPModule

        sharded = [m for m in module.modules() if isinstance(m, FSDPModule)]
        if not enabled or not sharded:
            return nullcontext()
        return _gradient_sync_off(sharded)

    def context_parallel(
        self, buffers: Sequence[torch.Tensor], seq_dims: Sequence[int], no_restore_buffers: Any = None
    ) -> AbstractContextManager[Any]:
        """A context in which ``buffers`` (inputs, labels, position tables) are split along ``seq_dims``
        over the context-parallel ranks and attention runs as ring attention (torch's
        ``context_parallel``; CUDA, with ``cp > 1``). Run forward and backward inside it."""
        if int(self.layout.cp) == 1:
            raise ValueError(
                "context_parallel() splits sequences over the context-parallel ranks, but the layout has cp=1. "
                "Set cp (cp_size=) > 1 on CUDA devices, or run the step without it."
            )
        from torch.distributed.tensor.experimental import context_parallel

        return context_parallel(
            self.layout.submesh("context_parallel"),
            buffers=list(buffers),
            buffer_seq_dims=list(seq_dims),
            no_restore_buffers=set(no_restore_buffers) if no_restore_buffers else None,
        )

    # -- state ---------------------------------------------------------------------------------
    def get_module_state_dict(self, module: nn.Module) -> dict[str, Any]:
        """The full state dict, gathered on CPU on global rank 0 (``{}`` elsewhere); every rank must call."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        if not _holds_dtensors(module):
            return super().get_module_state_dict(module)
        return get_model_state_dict(module, options=StateDictOptions(full_state_dict=True, cpu_offload=True))

    def load_module_state_dict(
        self, module: nn.Module, state_dict: dict[str, Any], strict: bool = True
    ) -> None:
        """Load a full state dict, which every rank passes, into the split/sharded module."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        if not _holds_dtensors(module):
            return super().load_module_state_dict(module, state_dict, strict)
        set_model_state_dict(
            module, state_dict, options=StateDictOptions(full_state_dict=True, strict=strict)
        )

    @classmethod
    def register_strategies(cls, strategy_registry: Any) -> None:
        strategy_registry.register(
            "model_parallel",
            cls,
            description="Tensor parallel x FSDP2 (HSDP when replicated) on a named DeviceMesh; sharded checkpoints.",
        )

    def __repr__(self) -> str:
        layout = self._layout or self._requested or "auto"
        return f"ModelParallelStrategy({layout!r}, precision={self._precision!r})"


@contextmanager
def _gradient_sync_off(modules: list[Any]) -> Iterator[None]:
    # Every FSDP module: configure_model() may have sharded blocks without sharding the root.
    for module in modules:
        module.set_requires_gradient_sync(False, recurse=False)
    try:
        yield
    finally:
        for module in modules:
            module.set_requires_gradient_sync(True, recurse=False)


def _check_data_parallel_coverage(module: nn.Module) -> None:
    """Raise if ``configure_model`` sharded part of the model and left parameters out of every FSDP group.

    Those would be neither sharded nor synchronised over the data-parallel ranks, so the ranks'
    copies would drift apart without any error.
    """
    from torch.distributed.tensor import DTensor

    data_parallel = {"dp_replicate", "dp_shard", "data_parallel", "dp_shard_cp"}
    left_out = [
        name
        for name, parameter in module.named_parameters()
        if not (
            isinstance(parameter, DTensor) and data_parallel & set(parameter.device_mesh.mesh_dim_names or ())
        )
    ]
    if left_out:
        shown = ", ".join(left_out[:5]) + (", ..." if len(left_out) > 5 else "")
        raise ValueError(
            f"configure_model() applied fully_shard to parts of {type(module).__name__}, but {len(left_out)} "
            f"parameter(s) are in no FSDP group ({shown}): they would not be synchronised over the data-parallel "
            f"ranks. Apply fully_shard to the module holding them as well (e.g. the whole model, last, over "
            f"self.device_mesh['data_parallel']), or leave fully_shard to the strategy."
        )


def _holds_dtensors(module: nn.Module) -> bool:
    from torch.distributed.tensor import DTensor

    return any(isinstance(p, DTensor) for p in module.parameters())
