"""Kwargs handlers: Accelerate's way to pass options to the objects the Accelerator creates.

Each handler is a dataclass whose fields mirror the options of one PyTorch object; only the fields
a user changed from their defaults are passed on (:meth:`KwargsHandler.to_kwargs`), so PyTorch's
own defaults apply otherwise.
"""

from __future__ import annotations

import dataclasses
import datetime
from enum import Enum
from typing import Any


class KwargsHandler:
    """Base of the kwargs handlers: turns the changed fields of a dataclass into keyword arguments."""

    def to_kwargs(self) -> dict[str, Any]:
        """The fields whose values differ from the class defaults."""
        defaults = {f.name: _default(f) for f in dataclasses.fields(self)}  # type: ignore[arg-type]
        return {
            name: value
            for name, value in dataclasses.asdict(self).items()  # type: ignore[call-overload]
            if value != defaults[name]
        }


def _default(field: dataclasses.Field[Any]) -> Any:
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return dataclasses.MISSING


class DDPCommunicationHookType(str, Enum):
    """Gradient communication hooks of ``DistributedDataParallel`` (only ``"no"`` is supported)."""

    NO = "no"
    FP16 = "fp16"
    BF16 = "bf16"
    POWER_SGD = "power_sgd"
    BATCHED_POWER_SGD = "batched_power_sgd"


@dataclasses.dataclass
class DistributedDataParallelKwargs(KwargsHandler):
    """Options for ``torch.nn.parallel.DistributedDataParallel`` (see its documentation).

    Example:
        >>> from drivetrain.utils import DistributedDataParallelKwargs
        >>> DistributedDataParallelKwargs(find_unused_parameters=True).to_kwargs()
        {'find_unused_parameters': True}
    """

    dim: int = 0
    broadcast_buffers: bool = True
    bucket_cap_mb: int = 25
    find_unused_parameters: bool = False
    check_reduction: bool = False
    gradient_as_bucket_view: bool = False
    static_graph: bool = False
    comm_hook: DDPCommunicationHookType | str = DDPCommunicationHookType.NO
    comm_wrapper: DDPCommunicationHookType | str = DDPCommunicationHookType.NO
    comm_state_option: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class GradScalerKwargs(KwargsHandler):
    """Options for the ``torch.amp.GradScaler`` used with ``mixed_precision="fp16"``."""

    init_scale: float = 65536.0
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 2000
    enabled: bool = True


@dataclasses.dataclass
class InitProcessGroupKwargs(KwargsHandler):
    """Options for the process group: ``backend`` and ``timeout`` (also the rendezvous timeout).

    ``init_method`` is accepted for compatibility only as ``None``: the cluster environment says
    where processes meet.
    """

    backend: str | None = "nccl"
    init_method: str | None = None
    timeout: datetime.timedelta | None = None


@dataclasses.dataclass
class AutocastKwargs(KwargsHandler):
    """Options for ``torch.autocast`` in mixed precision: ``enabled`` and ``cache_enabled``."""

    enabled: bool = True
    cache_enabled: bool | None = None


@dataclasses.dataclass
class AORecipeKwargs(KwargsHandler):
    """Options for ``mixed_precision="fp8"`` (torchao's float8 training), as in Accelerate.

    Args:
        config: a ``torchao.float8.Float8LinearConfig`` (e.g.
            ``Float8LinearConfig.from_recipe_name("rowwise")``); default: the ``"tensorwise"`` recipe.
        module_filter_func: ``(module, fully_qualified_name) -> bool``, which linear layers train in
            float8; default: all but the first and the last. Layers whose sizes are not multiples of
            16 are never converted.
        pad_inner_dim: without a ``config``, build the tensorwise one with torchao's
            ``pad_inner_dim`` (pad matrix sizes to multiples of 16 for ``torch._scaled_mm``).
        enable_fsdp_float8_all_gather: without a ``config``, build the tensorwise one with FSDP2's
            all-gather in float8. Unset, both are torchao's default (off), where Accelerate turns
            them on.

    Raises:
        ValueError: ``pad_inner_dim``/``enable_fsdp_float8_all_gather`` together with a ``config``
            (set them in the config).

    Example:
        >>> from drivetrain.utils import AORecipeKwargs
        >>> handler = AORecipeKwargs(module_filter_func=lambda module, fqn: "head" not in fqn)
    """

    config: Any = None
    module_filter_func: Any = None
    pad_inner_dim: bool | None = None
    enable_fsdp_float8_all_gather: bool | None = None

    def __post_init__(self) -> None:
        flags = {
            "pad_inner_dim": self.pad_inner_dim,
            "enable_fsdp_float8_all_gather": self.enable_fsdp_float8_all_gather,
        }
        given = [name for name, value in flags.items() if value is not None]
        if given and self.config is not None:
            raise ValueError(
                f"AORecipeKwargs({', '.join(given)}=..., config=...): these build the config when none is given; "
                f"with your own config, set them in it (Float8LinearConfig({given[0]}=...))."
            )

    def to_kwargs(self) -> dict[str, Any]:
        # Not dataclasses.asdict: it would turn the torchao config (a dataclass) into a dict.
        config = self.config
        if config is None and (
            self.pad_inner_dim is not None or self.enable_fsdp_float8_all_gather is not None
        ):
            from torchao.float8 import Float8LinearConfig

            config = Float8LinearConfig(
                pad_inner_dim=bool(self.pad_inner_dim),
                enable_fsdp_float8_all_gather=bool(self.enable_fsdp_float8_all_gather),
            )
        given = {"config": config, "module_filter_func": self.module_filter_func}
        return {name: value for name, value in given.items() if value is not None}


@dataclasses.dataclass
class ProfileKwargs(KwargsHandler):
    """Options for ``torch.profiler.profile`` in :meth:`drivetrain.Accelerator.profile`.

    Args:
        activities: ``"cpu"``, and the device's (``"cuda"``, ``"xpu"``); default: the CPU and
            this process's device.
        schedule_option: ``torch.profiler.schedule`` arguments (``wait``, ``warmup``, ``active``,
            ``repeat``, ``skip_first``), for profiling some steps of a loop that calls
            ``profiler.step()``.
        on_trace_ready: called with the profiler when a trace is ready.
        record_shapes: as for torch's profiler.
        profile_memory: as for torch's profiler.
        with_stack: as for torch's profiler.
        with_flops: as for torch's profiler.
        with_modules: as for torch's profiler.
        output_trace_dir: write each process's Chrome trace there as ``profile_<rank>.json``.
    """

    activities: list[str] | None = None
    schedule_option: dict[str, int] | None = None
    on_trace_ready: Any = None
    record_shapes: bool = False
    profile_memory: bool = False
    with_stack: bool = False
    with_flops: bool = False
    with_modules: bool = False
    output_trace_dir: str | None = None
