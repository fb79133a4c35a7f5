"""Turn the Accelerator's arguments (Accelerate's and drivetrain's) into one Strategy via ``connect()``.

Accelerate spells things its own way (``cpu=True``, ``mixed_precision="bf16"``, kwargs handlers);
here they become ``connect()`` arguments: the kwargs handlers become its ``strategy_options``
(DDP and process-group settings) and ``precision_options`` (loss scaler and autocast settings),
so ``connect()`` alone builds the strategy and the precision, once.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from enum import Enum
from typing import TYPE_CHECKING, Any

from drivetrain.strategies.launchers.overrides import accumulation_steps
from drivetrain.strategies.step_policy import check_accumulation_steps

# Imported by the functions that use them: building an Accelerator needs them, importing it does not.
if TYPE_CHECKING:
    from drivetrain.facade.state import GradientState
    from drivetrain.plugins.precision.precision import Precision
    from drivetrain.strategies.launchers.overrides import AccelerateVariables
    from drivetrain.strategies.strategy import Strategy
    from drivetrain.utils.configuration import (
        DataLoaderConfiguration,
        GradientAccumulationPlugin,
        ProjectConfiguration,
    )
    from drivetrain.utils.dynamo import TorchDynamoPlugin
    from drivetrain.utils.kwargs_handlers import (
        AORecipeKwargs,
        AutocastKwargs,
        DistributedDataParallelKwargs,
        GradScalerKwargs,
        InitProcessGroupKwargs,
        ProfileKwargs,
    )

_MIXED_PRECISION = ("no", "fp16", "bf16", "fp8")


@dataclasses.dataclass(frozen=True)
class Handlers:
    """The kwargs handlers given to the Accelerator, one of each kind at most."""

    ddp: DistributedDataParallelKwargs | None = None
    scaler: GradScalerKwargs | None = None
    process_group: InitProcessGroupKwargs | None = None
    autocast: AutocastKwargs | None = None
    profile: ProfileKwargs | None = None
    fp8: AORecipeKwargs | None = None


def sort_handlers(kwargs_handlers: Sequence[Any] | None) -> Handlers:
    """Check the kwargs handlers and file them by kind.

    Raises:
        TypeError: not a list, or an object that is not one of the supported handlers.
        ValueError: two handlers of the same kind.
    """
    from drivetrain.utils.kwargs_handlers import (
        AORecipeKwargs,
        AutocastKwargs,
        DistributedDataParallelKwargs,
        GradScalerKwargs,
        InitProcessGroupKwargs,
        ProfileKwargs,
    )

    if kwargs_handlers is None:
        return Handlers()
    if not isinstance(kwargs_handlers, (list, tuple)):
        raise TypeError(
            f"kwargs_handlers expects a list of handlers, got {type(kwargs_handlers).__name__}; "
            f"write kwargs_handlers=[{kwargs_handlers!r}]."
        )
    found: dict[str, Any] = {}
    fields: dict[type, str] = {
        DistributedDataParallelKwargs: "ddp",
        GradScalerKwargs: "scaler",
        InitProcessGroupKwargs: "process_group",
        AutocastKwargs: "autocast",
        ProfileKwargs: "profile",
        AORecipeKwargs: "fp8",
    }
    for handler in kwargs_handlers:
        field = fields.get(type(handler))
        if field is None:
            names = ", ".join(cls.__name__ for cls in fields)
            raise TypeError(
                f"Unsupported kwargs handler {handler!r} ({type(handler).__module__}.{type(handler).__name__}). "
                f"drivetrain.Accelerator supports {names} from drivetrain.utils."
            )
        if field in found:
            raise ValueError(
                f"kwargs_handlers holds two {type(handler).__name__}; pass one and merge their options."
            )
        found[field] = handler
    return Handlers(**found)


def choose_precision(
    mixed_precision: str | Enum | None, fp16: bool | None, precision: Any
) -> str | int | Precision | None:
    """One precision from Accelerate's ``mixed_precision``/``fp16`` and drivetrain's ``precision``.

    Raises:
        ValueError: an unknown ``mixed_precision``, or two settings that disagree.
    """
    given: list[tuple[str, Any]] = []
    if fp16 is not None:
        if not isinstance(fp16, bool):
            raise TypeError(f"fp16 expects True or False, got {fp16!r}.")
        if fp16:
            given.append(("fp16=True", "fp16"))
    if mixed_precision is not None:
        value = mixed_precision.value if isinstance(mixed_precision, Enum) else mixed_precision
        if value not in _MIXED_PRECISION:
            raise ValueError(
                f"mixed_precision={mixed_precision!r} is not supported; use one of "
                f"{', '.join(map(repr, _MIXED_PRECISION))} (or drivetrain's precision= for '16-true', "
                f"'bf16-true', '64-true' …)."
            )
        given.append((f"mixed_precision={value!r}", value))
    if precision is not None:
        given.append((f"precision={precision!r}", precision))
    if len(given) > 1:
        names = {_canonical(value) for _, value in given}
        if len(names) > 1:
            raise ValueError(
                f"The precision is set twice and the settings disagree: {' and '.join(where for where, _ in given)}. "
                f"Set it once."
            )
    return given[-1][1] if given else None


def _canonical(value: Any) -> Any:
    from drivetrain.plugins.precision.names import canonical_precision
    from drivetrain.plugins.precision.precision import Precision

    if isinstance(value, Precision):
        return id(value)
    return canonical_precision(value)


def choose_accelerator(accelerator: Any, cpu: bool) -> Any:
    """``cpu=True`` means ``accelerator="cpu"`` (it does not limit the number of processes)."""
    if not isinstance(cpu, bool):
        raise TypeError(f"cpu expects True or False, got {cpu!r}.")
    if not cpu:
        return accelerator
    if isinstance(accelerator, str) and accelerator in ("auto", "cpu"):
        return "cpu"
    from drivetrain.accelerators.cpu import CPUAccelerator  # no hardware plugin is loaded before one is used

    if isinstance(accelerator, CPUAccelerator):
        return accelerator
    raise ValueError(
        f"cpu=True asks for the CPU, but accelerator={accelerator!r} asks for other hardware. "
        f"Drop one of them (cpu=True is the same as accelerator='cpu')."
    )


def build_strategy(
    *,
    accelerator: Any,
    strategy: Any,
    devices: Any,
    num_nodes: int,
    precision: Any,
    plugins: Any,
    handlers: Handlers,
    debug: bool = False,
    parallelism_options: dict[str, Any] | None = None,
) -> Strategy:
    """Resolve the settings with one ``connect()``, the kwargs handlers passed on as its options."""
    from drivetrain.connector import connect

    strategy_options = {**_strategy_options(handlers), **(parallelism_options or {})}
    if debug:
        _debug_strategy(strategy, strategy_options)
    precision_options = _precision_options(handlers)
    built = connect(
        accelerator,
        strategy,
        "auto" if devices is None else devices,
        num_nodes,
        precision,
        plugins,
        strategy_options=strategy_options,
        precision_options=precision_options,
    )
    return built


def parallelism(strategy: Any, config: Any, tp_plan: Any) -> tuple[Any, dict[str, Any]]:
    """``Accelerator(parallelism_config=..., tp_plan=...)`` as the strategy name and its options.

    A parallelism config means ``strategy="model_parallel"`` with the config's layout; the plan
    is checked now and applied by the strategy in ``prepare``.
    """
    if config is None:
        if tp_plan is not None:
            raise ValueError(
                "tp_plan= splits layers over the tensor-parallel ranks of a parallelism_config, and none was given. "
                "Pass parallelism_config=ParallelismConfig(tp_size=..., dp_shard_size=...) too."
            )
        return strategy, {}
    from drivetrain.strategies.layout import ParallelismConfig

    if not isinstance(config, ParallelismConfig):
        raise TypeError(
            f"parallelism_config= expects a drivetrain.ParallelismConfig (Accelerate's fields: dp_replicate_size, "
            f"dp_shard_size, tp_size, cp_size), got {type(config).__name__}."
        )
    if not (isinstance(strategy, str) and strategy in ("auto", "model_parallel")):
        raise ValueError(
            f"parallelism_config= runs the model-parallel strategy, but strategy={strategy!r} asks for another. Leave "
            f"strategy at 'auto', or pass a ModelParallelStrategy(layout=...) as strategy= without parallelism_config."
        )
    options: dict[str, Any] = {"layout": config.to_layout()}
    if tp_plan is not None:
        options["tp_plan"] = tp_plan
    elif config.tp_enabled:
        raise ValueError(
            f"ParallelismConfig(tp_size={config.tp_size}) needs a tensor-parallel plan to split the model with: pass "
            f"tp_plan={{'module.path': 'colwise' | 'rowwise' | ParallelStyle, ...}} to the Accelerator."
        )
    return "model_parallel", options


def debug_mode(debug: bool | None, from_environment: bool | None) -> bool:
    """``debug`` if given, else ``ACCELERATE_DEBUG_MODE`` (as Accelerate reads it), else off."""
    if debug is not None:
        if not isinstance(debug, bool):
            raise TypeError(f"Accelerator(debug=...) takes True or False, got {debug!r}.")
        return debug
    return bool(from_environment)


def _debug_strategy(strategy: Any, options: dict[str, Any]) -> None:
    """Debug mode checks every collective (shapes, dtypes, order) through the strategy's ``debug_collectives``."""
    if isinstance(strategy, str):
        options["debug_collectives"] = True
        return
    from drivetrain.strategies import ParallelStrategy

    if isinstance(strategy, ParallelStrategy) and not strategy.debug_collectives:
        raise ValueError(
            f"Debug mode (Accelerator(debug=True) or ACCELERATE_DEBUG_MODE=1) checks collectives through the "
            f"strategy, but the given {type(strategy).__name__} was built without it. Pass "
            f"{type(strategy).__name__}(..., debug_collectives=True), or a strategy name."
        )


def _strategy_options(handlers: Handlers) -> dict[str, Any]:
    """DistributedDataParallelKwargs and InitProcessGroupKwargs as the strategy's constructor arguments."""
    ddp = handlers.ddp.to_kwargs() if handlers.ddp is not None else {}
    group = handlers.process_group.to_kwargs() if handlers.process_group is not None else {}
    unsupported = sorted(set(ddp) & {"comm_hook", "comm_wrapper", "comm_state_option"})
    if unsupported:
        raise ValueError(
            f"DistributedDataParallelKwargs({', '.join(unsupported)}=...) is not supported by drivetrain. "
            f"Register the hook on the prepared model instead: model.register_comm_hook(state, hook)."
        )
    if "init_method" in group:
        raise ValueError(
            f"InitProcessGroupKwargs(init_method={group['init_method']!r}) is not supported: processes meet "
            f"where the cluster environment says (MASTER_ADDR/MASTER_PORT, SLURM …). Leave init_method out."
        )
    options = dict(ddp)
    if "backend" in group:
        options["process_group_backend"] = group["backend"]
    if "timeout" in group:
        options["timeout"] = group["timeout"]
    return options


def _precision_options(handlers: Handlers) -> dict[str, Any]:
    """GradScalerKwargs, AutocastKwargs and AORecipeKwargs as the precision's constructor arguments.

    A precision without a loss scaler or without autocast has no use for them; ``connect()`` (or
    the precision) says so in a warning naming ``scaler_kwargs`` / ``autocast_kwargs``.
    """
    options: dict[str, Any] = {}
    if handlers.scaler is not None and handlers.scaler.to_kwargs():
        options["scaler_kwargs"] = handlers.scaler.to_kwargs()
    if handlers.autocast is not None and handlers.autocast.to_kwargs():
        options["autocast_kwargs"] = handlers.autocast.to_kwargs()
    if handlers.fp8 is not None:
        recipe = handlers.fp8.to_kwargs()
        if "config" in recipe:
            options["config"] = recipe["config"]
        if "module_filter_func" in recipe:
            options["module_filter_fn"] = recipe["module_filter_func"]
    return options


def gradient_state(steps: int | None, plugin: GradientAccumulationPlugin | None) -> GradientState:
    """The Accelerator's accumulation state; ``drivetrain launch --gradient_accumulation_steps`` is the default."""
    from drivetrain.facade.state import GradientState

    if plugin is None:
        chosen = accumulation_steps(steps, "gradient_accumulation_steps")
        return GradientState(check_accumulation_steps(1 if chosen is None else chosen))
    if steps is not None and steps != 1:
        raise ValueError(
            "Pass gradient_accumulation_steps or gradient_accumulation_plugin, not both "
            "(GradientAccumulationPlugin(num_steps=...) holds the steps)."
        )
    if plugin.num_steps is None:
        raise ValueError(
            "GradientAccumulationPlugin(num_steps=None): set num_steps to the batches per optimizer step."
        )
    num_steps = check_accumulation_steps(
        accumulation_steps(plugin.num_steps, "GradientAccumulationPlugin.num_steps")
    )
    return GradientState(num_steps, plugin.sync_with_dataloader, plugin.sync_each_batch)


def data_config(
    config: DataLoaderConfiguration | None,
    split_batches: bool | None,
    dispatch: bool | None,
    even: bool | None,
) -> DataLoaderConfiguration:
    from drivetrain.utils.configuration import DataLoaderConfiguration

    result = config if config is not None else DataLoaderConfiguration()
    for name, value in (
        ("split_batches", split_batches),
        ("dispatch_batches", dispatch),
        ("even_batches", even),
    ):
        if value is None:
            continue
        if config is not None and getattr(config, name) != value:
            raise ValueError(
                f"{name}={value!r} disagrees with dataloader_config.{name}={getattr(config, name)!r}; set it in "
                f"one place (DataLoaderConfiguration is the current one)."
            )
        result = _replace(result, **{name: value})
    return result


def _replace(config: DataLoaderConfiguration, **changes: Any) -> DataLoaderConfiguration:
    return dataclasses.replace(config, **changes)


def project_config(
    config: ProjectConfiguration | None, project_dir: str | os.PathLike[str] | None
) -> ProjectConfiguration:
    from drivetrain.utils.configuration import ProjectConfiguration

    result = config if config is not None else ProjectConfiguration()
    if project_dir is not None:
        if result.project_dir is not None and os.fspath(project_dir) != result.project_dir:
            raise ValueError(
                f"project_dir={os.fspath(project_dir)!r} disagrees with project_config.project_dir="
                f"{result.project_dir!r}; set it once."
            )
        result.set_directories(project_dir)
    return result


def reject_plugins(deepspeed: Any, fsdp: Any, megatron: Any) -> None:
    for name, value, fix in (
        ("deepspeed_plugin", deepspeed, "strategy='deepspeed_stage_2' (or a DeepSpeedStrategy instance)"),
        ("fsdp_plugin", fsdp, "strategy='fsdp' (or an FSDPStrategy instance)"),
        ("megatron_lm_plugin", megatron, "another strategy: Megatron-LM is not supported"),
    ):
        if value is not None:
            raise ValueError(f"{name}= is Accelerate's way to configure this; drivetrain uses {fix}.")


def dynamo_settings(
    backend: Any, plugin: TorchDynamoPlugin | None, environment: AccelerateVariables, strategy: Strategy
) -> TorchDynamoPlugin:
    """The compile settings: ``dynamo_backend`` or ``dynamo_plugin``, unset fields from ``ACCELERATE_DYNAMO_*``.

    Raises:
        TypeError, ValueError: both arguments, a value ``torch.compile`` cannot take, a backend
            this torch does not have, or a strategy that cannot run a compiled model.
    """
    from drivetrain.utils.dynamo import COMPILE_MODES, TorchDynamoPlugin, backend_of, check_backend_available

    mode = environment.dynamo_mode
    if mode is not None and mode not in COMPILE_MODES:
        raise ValueError(
            f"ACCELERATE_DYNAMO_MODE={mode!r} is not a torch.compile mode; use one of "
            f"{', '.join(map(repr, COMPILE_MODES))}, or unset it."
        )
    if plugin is not None and backend is not None:
        raise ValueError(
            "Pass dynamo_backend or dynamo_plugin, not both (TorchDynamoPlugin(backend=...) holds the backend)."
        )
    if plugin is None:
        plugin = TorchDynamoPlugin(
            backend=backend_of(backend, "dynamo_backend=") if backend is not None else None
        )
    elif not isinstance(plugin, TorchDynamoPlugin):
        raise TypeError(
            f"dynamo_plugin= takes a drivetrain.utils.TorchDynamoPlugin, got {type(plugin).__module__}."
            f"{type(plugin).__name__}."
        )
    where = "ACCELERATE_DYNAMO_BACKEND"
    resolved = dataclasses.replace(
        plugin,
        backend=plugin.backend
        if plugin.backend is not None
        else backend_of(environment.dynamo_backend or "no", where),
        mode=plugin.mode if plugin.mode is not None else environment.dynamo_mode or "default",
        fullgraph=plugin.fullgraph
        if plugin.fullgraph is not None
        else bool(environment.dynamo_use_fullgraph),
        dynamic=plugin.dynamic if plugin.dynamic is not None else environment.dynamo_use_dynamic,
    )
    if resolved.compiles:
        if not _compiles_under(strategy):
            raise ValueError(
                f"dynamo_backend={resolved.to_kwargs()['backend']!r} with {type(strategy).__name__} is not supported: "
                f"drivetrain compiles models under single-device, DDP and FSDP strategies. Compile inside the model "
                f"(torch.compile(block) for each block in its __init__) and leave dynamo_backend unset."
            )
        if resolved.fullgraph and _wraps_modules(strategy):
            raise ValueError(
                f"fullgraph=True (TorchDynamoPlugin or ACCELERATE_DYNAMO_USE_FULLGRAPH) cannot compile "
                f"{type(strategy).__name__}'s wrapper: DistributedDataParallel's forward holds Python logic torch "
                f"does not trace, so the first step would fail. Leave fullgraph off (your model is still compiled, "
                f"split at DDP's buckets), or compile the model's blocks yourself with torch.compile(block, "
                f"fullgraph=True)."
            )
        check_backend_available(resolved)
    return resolved


def _compiles_under(strategy: Strategy) -> bool:
    """Whether ``prepare`` can compile the models ``strategy`` sets up (not DeepSpeed's engine, nor
    tensor-parallel layouts, which are untested with a compiled wrapper)."""
    return strategy.compiles_models


def _wraps_modules(strategy: Strategy) -> bool:
    """Whether ``prepare`` puts models in a wrapper of the strategy's (DDP) before compiling them."""
    return strategy.wraps_models
