"""``connect()``: the one place that turns user settings into a fully wired Strategy.

Both front doors (and the CLI) pass their ``accelerator``, ``strategy``, ``devices``,
``num_nodes``, ``precision`` and ``plugins`` arguments here. Strings are resolved through the
registries, instances are taken as they are, and every contradictory or impossible combination
is an error that says how to fix it. What comes back is ready to use: no component is filled
in later.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Mapping, Sequence
from typing import Any, TypeAlias

import torch
from torch import nn

from drivetrain._utilities.log import get_logger
from drivetrain._utilities.registry import RegistryEntry
from drivetrain._utilities.retired import warn_renamed
from drivetrain.accelerators import (
    Accelerator,
    AcceleratorRegistry,
    devices_for,
    resolve_accelerator,
)
from drivetrain.plugins.environments import ClusterEnvironment, detect_cluster_environment
from drivetrain.plugins.io import CheckpointIO
from drivetrain.plugins.precision import Precision, canonical_precision, precision_from_name
from drivetrain.strategies import (
    DDPStrategy,
    ParallelStrategy,
    SingleDeviceStrategy,
    Strategy,
    StrategyRegistry,
)
from drivetrain.strategies.launchers.overrides import (
    ACCELERATOR_VARIABLE,
    PRECISION_VARIABLE,
    launched_accelerator,
    launched_precision,
)
from drivetrain.strategies.memory_estimate import AutoStrategyChoice, choose_data_parallel

_COMPONENTS = ("accelerator", "precision", "checkpoint_io", "cluster_environment")

#: One entry of ``plugins=``: a plugin instance or a precision name (``"bf16-mixed"``, ``16`` …).
PluginInput: TypeAlias = Precision | CheckpointIO | ClusterEnvironment | str | int


def connect(
    accelerator: str | Accelerator = "auto",
    strategy: str | Strategy = "auto",
    devices: int | str | Sequence[int] = "auto",
    num_nodes: int = 1,
    precision: str | int | Precision | None = None,
    plugins: PluginInput | Sequence[PluginInput] | None = None,
    *,
    strategy_options: Mapping[str, Any] | None = None,
    precision_options: Mapping[str, Any] | None = None,
) -> Strategy:
    """Resolve the settings into a Strategy that owns its accelerator, precision, checkpoint IO and cluster environment.

    Args:
        accelerator: a registered name (``"cpu"``, ``"cuda"``, ``"gpu"``, ``"auto"``, a user's
            ``"xpu"`` …) or an :class:`~drivetrain.accelerators.Accelerator` instance.
        strategy: a registered name (``"ddp"``, ``"ddp_spawn"``, ``"auto"`` …) or a
            :class:`~drivetrain.strategies.Strategy` instance.
        devices: ``"auto"``, a count, ``-1`` for all, or device indices (``"0,1"``, ``[0, 1]``).
        num_nodes: how many nodes the job spans.
        precision: ``"32-true"`` when ``None``; any precision name (``"bf16-mixed"``, ``"fp16"`` …)
            or a :class:`~drivetrain.plugins.Precision` instance.
        plugins: one or a list of Precision, CheckpointIO and ClusterEnvironment instances
            (or precision names).
        strategy_options: constructor arguments for the strategy built from a name, on top of
            the registered preset's (``{"find_unused_parameters": True, "timeout": 600}``). A run
            of one process under ``strategy="auto"`` builds no parallel strategy and has no use
            for them (the same script also runs on many processes). An option the preset sets
            to another value, or one the strategy does not take, is an error; so are options
            with a Strategy instance (pass them to its constructor).
        precision_options: constructor arguments for the precision built from a name
            (``{"scaler_kwargs": {"init_scale": 1024.0}, "autocast_kwargs": {...}}``). An option
            the resolved precision does not take has no effect and is reported with a warning;
            options with a Precision instance are an error (configure the instance).

    Returns:
        The strategy, with every component set.

    Raises:
        TypeError: an argument of the wrong type.
        ValueError: an unknown name, a component given twice, or a combination that cannot run.
    """
    _check_argument_types(accelerator, strategy, devices, num_nodes, precision)
    given = _Components()
    for plugin in _as_plugin_list(plugins):
        given.add_plugin(plugin)
    if precision is not None:
        if precision in (16, "16") and not isinstance(precision, bool):
            warn_renamed(
                f"precision={precision!r}",
                "precision='16-mixed'",
                "Lightning 1.x's spelling of float16 mixed precision (autocast, float32 weights, loss scaling)",
            )
        given.add("precision", precision, "precision=")

    entry: RegistryEntry | None = None
    strategy_devices: list[torch.device] | None = None
    if isinstance(strategy, str):
        if strategy != "auto":
            entry = StrategyRegistry.entry(strategy)
            for name in _COMPONENTS:
                if entry.init_kwargs.get(name) is not None:
                    given.add(name, entry.init_kwargs[name], f"the registered strategy {strategy!r}")
    else:
        for name, value in _given_plugins(strategy).items():
            given.add(name, value, f"the {type(strategy).__name__} instance")
        strategy_devices = _given_devices(strategy)

    _add_launched_precision(given)
    accelerator_choice = _choose_accelerator(accelerator, given, strategy_devices)
    hardware = resolve_accelerator(accelerator_choice)
    environment = given.get("cluster_environment") or detect_cluster_environment()
    requested_devices = devices
    devices, num_nodes = _devices_under(environment, devices, num_nodes)
    if strategy_devices is None:
        parallel_devices = devices_for(hardware, devices)
    else:
        parallel_devices = _check_strategy_devices(
            strategy, strategy_devices, hardware, devices, requested_devices
        )
    environment.validate_settings(len(parallel_devices), num_nodes)
    world_size = (
        environment.world_size()
        if environment.creates_processes_externally
        else (len(parallel_devices) * num_nodes)
    )

    precision_plugin = given.get("precision")
    if isinstance(precision_plugin, Precision):
        if precision_options:
            raise ValueError(
                f"precision_options ({', '.join(precision_options)}) configure a precision built from a name, but "
                f"the precision is the {type(precision_plugin).__name__} instance given by {given.source('precision')}. "
                f"Configure that instance instead."
            )
    else:
        precision_plugin = precision_from_name(
            precision_plugin if precision_plugin is not None else "32-true",
            parallel_devices[0].type,
            options=precision_options,
        )

    if isinstance(strategy, Strategy):
        if strategy_options:
            raise ValueError(
                f"strategy_options ({', '.join(strategy_options)}) configure a strategy built from a name, but "
                f"strategy= is a {type(strategy).__name__} instance you built. Pass them to its constructor instead, "
                f"e.g. {type(strategy).__name__}({', '.join(f'{k}=...' for k in strategy_options)})."
            )
        built = strategy
    else:
        built = _build_strategy(entry, world_size, parallel_devices, hardware, dict(strategy_options or {}))
    _check_strategy_fits(built, strategy, world_size, len(parallel_devices), environment, hardware)
    _check_interactive_session(built, strategy, len(parallel_devices), environment)
    built.connect_plugins(
        accelerator=hardware,
        precision=precision_plugin,
        checkpoint_io=given.get("checkpoint_io"),
        cluster_environment=environment,
        parallel_devices=parallel_devices,
        num_nodes=num_nodes,
    )
    return built


class _Components:
    """The accelerator/precision/checkpoint IO/cluster environment, each from at most one place."""

    def __init__(self) -> None:
        self._values: dict[str, tuple[Any, str]] = {}

    def add(self, name: str, value: Any, source: str) -> None:
        if name in self._values:
            previous, where = self._values[name]
            if previous is value:
                return
            raise ValueError(
                f"The {name.replace('_', ' ')} is given twice: {previous!r} by {where} and {value!r} by {source}. "
                f"Give it in one place only."
            )
        self._values[name] = (value, source)

    def add_plugin(self, plugin: Any) -> None:
        if isinstance(plugin, Precision):
            self.add("precision", plugin, "plugins=")
        elif isinstance(plugin, CheckpointIO):
            self.add("checkpoint_io", plugin, "plugins=")
        elif isinstance(plugin, ClusterEnvironment):
            self.add("cluster_environment", plugin, "plugins=")
        elif isinstance(plugin, (str, int)) and not isinstance(plugin, bool):
            try:
                canonical_precision(plugin)
            except ValueError:
                raise ValueError(
                    f"plugins= got the string {plugin!r}, but only precision names are accepted there. "
                    f"Pass accelerators with accelerator= and strategies with strategy=."
                ) from None
            self.add("precision", plugin, "plugins=")
        elif isinstance(plugin, (Accelerator, Strategy)):
            kind = "accelerator" if isinstance(plugin, Accelerator) else "strategy"
            raise TypeError(f"plugins= got {plugin!r}; pass it as {kind}= instead.")
        else:
            raise TypeError(
                f"plugins= got {plugin!r} of type {type(plugin).__name__}. Accepted: Precision, CheckpointIO and "
                f"ClusterEnvironment instances, or precision names."
            )

    def get(self, name: str) -> Any:
        value = self._values.get(name)
        return value[0] if value is not None else None

    def source(self, name: str) -> str:
        return self._values[name][1]


def _given_plugins(strategy: Strategy) -> dict[str, Any]:
    given = strategy.given_plugins()
    unknown = sorted(set(given) - set(_COMPONENTS)) if isinstance(given, dict) else None
    if unknown is None or unknown:
        raise TypeError(
            f"{type(strategy).__name__}.given_plugins() must return a dict with keys among "
            f"{', '.join(_COMPONENTS)}, got {given!r}."
        )
    return {name: value for name, value in given.items() if value is not None}


def _as_plugin_list(plugins: Any) -> list[Any]:
    if plugins is None:
        return []
    if isinstance(plugins, (list, tuple)):
        return list(plugins)
    return [plugins]


def _check_argument_types(
    accelerator: Any, strategy: Any, devices: Any, num_nodes: Any, precision: Any
) -> None:
    for name, value, base in (("accelerator", accelerator, Accelerator), ("strategy", strategy, Strategy)):
        if isinstance(value, type) and issubclass(value, base):
            raise TypeError(
                f"{name}= got the class {value.__name__}; pass an instance: {name}={value.__name__}()."
            )
        if not isinstance(value, (str, base)):
            raise TypeError(
                f"{name}= expects a registered name or a {base.__name__} instance, got {type(value).__name__} "
                f"({value!r})."
            )
    if isinstance(num_nodes, bool) or not isinstance(num_nodes, int):
        raise TypeError(f"num_nodes= expects an int, got {type(num_nodes).__name__} ({num_nodes!r}).")
    if num_nodes < 1:
        raise ValueError(
            f"num_nodes={num_nodes} is not allowed: a job runs on at least one node. Use num_nodes>=1."
        )
    if (precision is not None and not isinstance(precision, (str, int, Precision))) or isinstance(
        precision, bool
    ):
        raise TypeError(
            f"precision= expects a name such as '32-true' or 'bf16-mixed', or a Precision instance, got {precision!r}."
        )
    if isinstance(devices, bool) or not isinstance(devices, (int, str, list, tuple)):
        raise TypeError(
            f"devices= expects 'auto', a number, -1 or a list of device indices, got {type(devices).__name__} "
            f"({devices!r})."
        )


def _given_devices(strategy: Strategy) -> list[torch.device] | None:
    given = strategy.given_devices()
    if given is None:
        return None
    if (
        not isinstance(given, (list, tuple))
        or not given
        or not all(isinstance(d, torch.device) for d in given)
    ):
        raise TypeError(
            f"{type(strategy).__name__}.given_devices() must return None or a non-empty list of torch.device, "
            f"got {given!r}."
        )
    return list(given)


def _add_launched_precision(given: _Components) -> None:
    """``drivetrain launch --mixed_precision`` is the default; a precision the script sets wins."""
    launched = launched_precision()
    if launched is None:
        return
    source = f"drivetrain launch (the {PRECISION_VARIABLE} variable)"
    try:
        canonical = canonical_precision(launched)
    except ValueError as error:
        raise ValueError(f"{source} holds an unknown precision: {error}") from None
    chosen = given.get("precision")
    if chosen is None:
        given.add("precision", launched, source)
    elif isinstance(chosen, Precision) or canonical_precision(chosen) != canonical:
        warnings.warn(
            f"{source} asks for precision {launched!r}, but the script sets {chosen!r}; the script's setting is "
            f"used. Drop one of them.",
            UserWarning,
            stacklevel=3,
        )


def _choose_accelerator(
    accelerator: str | Accelerator, given: _Components, strategy_devices: list[torch.device] | None
) -> str | Accelerator:
    from_strategy = given.get("accelerator")
    launched = launched_accelerator()
    if isinstance(accelerator, str) and accelerator == "auto":
        chosen: str | Accelerator = from_strategy if from_strategy is not None else (launched or "auto")
        if (
            chosen == "auto"
            and strategy_devices is not None
            and strategy_devices[0].type in AcceleratorRegistry
        ):
            chosen = strategy_devices[0].type  # the strategy's own devices say which hardware
    elif from_strategy is not None and from_strategy is not accelerator:
        raise ValueError(
            f"The accelerator is given twice: accelerator={accelerator!r} and {from_strategy!r} inside the strategy. "
            f"Give it in one place only."
        )
    else:
        chosen = accelerator
    if launched is not None and isinstance(chosen, str) and chosen not in ("auto", launched):
        raise ValueError(
            f"drivetrain launch --accelerator {launched} (the {ACCELERATOR_VARIABLE} variable) disagrees with "
            f"accelerator={chosen!r} in the script. Drop one of them, or make them the same."
        )
    return chosen


def _devices_under(environment: ClusterEnvironment, devices: Any, num_nodes: int) -> tuple[Any, int]:
    """Under an external launcher, ``devices="auto"`` means the processes it started on each node."""
    if not environment.creates_processes_externally or devices != "auto":
        return devices, num_nodes
    per_node = environment.processes_per_node()
    if per_node is None:
        return max(1, environment.world_size() // num_nodes), num_nodes
    if num_nodes == 1 and environment.world_size() > per_node:
        num_nodes = environment.world_size() // per_node  # num_nodes left at its default: take the launcher's
    return per_node, num_nodes


def _check_strategy_devices(
    strategy: str | Strategy,
    given: list[torch.device],
    hardware: Accelerator,
    devices: Any,
    requested: Any,
) -> list[torch.device]:
    """The devices a strategy instance was built with, checked against the accelerator and ``devices=``."""
    owner = f"{type(strategy).__name__}(...)"  # only instances give their own devices
    wanted = (
        None
        if isinstance(devices, str) and devices.strip().lower() == "auto"
        else devices_for(hardware, devices)
    )
    kind = (wanted or devices_for(hardware, 1))[0].type
    if any(device.type != kind for device in given):
        types = sorted({device.type for device in given})
        raise ValueError(
            f"{owner} was built with the devices {_listed(given)}, but the accelerator is "
            f"{type(hardware).__name__}, whose devices are {kind!r} devices. Use accelerator={types[0]!r} "
            f"(or 'auto', which follows the strategy's devices), or build the strategy with {kind!r} devices, "
            f"or leave its devices out and choose them with devices=."
        )
    if wanted is not None and not _same_devices(wanted, given):
        where = (
            f"devices={requested!r}"
            if requested == devices
            else f"devices={devices!r} (the processes per node the launcher started)"
        )
        raise ValueError(
            f"{owner} was built with the devices {_listed(given)}, but {where} asks for "
            f"{_listed(wanted)}. Leave devices= at 'auto' (the strategy's devices are used), or make the two agree."
        )
    return given


def _same_devices(wanted: list[torch.device], given: list[torch.device]) -> bool:
    return len(wanted) == len(given) and all(
        a.type == b.type and (a.index is None or b.index is None or a.index == b.index)
        for a, b in zip(wanted, given, strict=True)
    )


def _listed(devices: list[torch.device]) -> str:
    return "[" + ", ".join(str(device) for device in devices) + "]"


def _build_strategy(
    entry: RegistryEntry | None,
    world_size: int,
    parallel_devices: list[torch.device],
    hardware: Accelerator,
    options: dict[str, Any],
) -> Strategy:
    if entry is None:  # strategy="auto"
        own = hardware.auto_strategy(world_size)  # hardware with strategies of its own (XLA, HPU) names them
        if own is not None:
            entry = StrategyRegistry.entry(own)
        elif world_size == 1:
            return SingleDeviceStrategy(device=parallel_devices[0])  # one process: options have nothing to do
        else:
            entry = StrategyRegistry.entry("ddp_notebook" if _interactive() else "ddp")
        if world_size == 1:
            options = {}
    preset = {k: v for k, v in entry.init_kwargs.items() if k not in _COMPONENTS}
    clashes = sorted(k for k in options if k in preset and preset[k] != options[k])
    if clashes:
        raise ValueError(
            f"strategy={entry.name!r} sets {', '.join(f'{k}={preset[k]!r}' for k in clashes)}, but strategy_options "
            f"set {', '.join(f'{k}={options[k]!r}' for k in clashes)}. Set them once."
        )
    try:
        return entry.cls(**{**preset, **options})
    except TypeError as error:
        with_options = f" with strategy_options {sorted(options)}" if options else ""
        raise TypeError(
            f"Could not build the registered strategy {entry.name!r} ({entry.cls.__name__}){with_options}: {error}"
        ) from None


def _check_strategy_fits(
    strategy: Strategy,
    requested: str | Strategy,
    world_size: int,
    num_devices: int,
    environment: ClusterEnvironment,
    hardware: Accelerator,
) -> None:
    name = repr(requested) if isinstance(requested, str) else f"{type(requested).__name__}(...)"
    if not isinstance(strategy, ParallelStrategy) and world_size > 1:
        raise ValueError(
            f"strategy={name} runs a single process, but the job has {world_size} processes "
            f"({num_devices} device(s) per node). Use strategy='ddp' (or 'auto'), or devices=1."
        )
    if isinstance(strategy, DDPStrategy) and world_size == 1 and not environment.creates_processes_externally:
        # As in Lightning: a process group of one (the same program then runs on N devices unchanged).
        from drivetrain._utilities.log import get_logger

        get_logger(__name__).info(
            f"strategy={name} with one device runs a process group of one process; strategy='auto' would "
            f"skip the group and the DDP wrapper."
        )
    start_method = getattr(strategy, "start_method", "popen")
    if environment.creates_processes_externally and start_method != "popen":
        raise ValueError(
            f"strategy={name} starts its own processes (start_method={start_method!r}), but "
            f"{type(environment).__name__} already started them. Use a strategy without start_method="
            f"{start_method!r} (e.g. 'ddp')."
        )
    try:
        strategy.check_accelerator(hardware)
    except ValueError as error:
        if not isinstance(requested, str) or requested == "auto":
            raise
        # A preset's error speaks of its class ("strategy='xla' runs on ..."); say which preset was asked for.
        entry = StrategyRegistry.entry(requested)
        preset = ", ".join(f"{k}={v!r}" for k, v in entry.init_kwargs.items() if k not in _COMPONENTS)
        described = f" ({entry.description.rstrip('.')})" if entry.description else ""
        raise ValueError(
            f"strategy={requested!r} is the registered preset {entry.cls.__name__}({preset}){described}, which cannot run on "
            f"{type(hardware).__name__}: {error}"
        ) from None


def _check_interactive_session(
    strategy: Strategy, requested: str | Strategy, num_devices: int, environment: ClusterEnvironment
) -> None:
    """Refuse, when code runs from a prompt, a strategy whose launcher cannot start processes from there.

    Checked here, when the Trainer or the Accelerator is built, so that nothing is started: the
    re-run launcher would start the notebook's kernel (``sys.argv`` is the kernel's command) or
    an empty interpreter again instead of the training code.
    """
    if environment.creates_processes_externally or not _interactive():
        return
    launcher = strategy.launcher
    if launcher is None or launcher.is_interactive_compatible:
        return
    start_method = getattr(strategy, "start_method", None)
    if start_method == "popen" and num_devices == 1:
        return  # this process is the node's only one: nothing is re-run
    name = repr(requested) if isinstance(requested, str) else f"{type(requested).__name__}(...)"
    if start_method == "popen":
        how = (
            "starts its other processes by re-running this program's command line, which from an interactive "
            "session starts another interpreter (or notebook kernel) instead of your training code"
        )
    elif start_method is not None:
        how = (
            f"starts its processes with the {start_method!r} method, whose new processes cannot import code "
            f"typed into an interactive session"
        )
    else:
        how = f"uses {type(launcher).__name__}, which cannot start processes from an interactive session"
    raise ValueError(
        f"strategy={name} {how} (a Jupyter notebook, IPython or `python -i`). Use strategy='ddp_notebook' "
        f"(DDP with processes forked from this session; other strategies take start_method='fork'), or run "
        f"the code as a script (`python train.py`)."
    )


def fit_auto_strategy(strategy: Strategy, module: nn.Module) -> tuple[Strategy, AutoStrategyChoice | None]:
    """For ``strategy="auto"`` on several processes: keep DDP, or build FSDP when DDP would not fit the device.

    Called by a front door once the model is known and before the processes start, with the
    strategy ``connect(strategy="auto", ...)`` returned. DDP keeps a full copy of the weights,
    gradients and optimizer states (Adam assumed) on every process; when that is more than the
    hardware accelerator's :meth:`~drivetrain.accelerators.Accelerator.training_memory`, an
    :class:`~drivetrain.strategies.FSDPStrategy` with the same accelerator, precision, checkpoint
    IO, cluster environment, devices and process-group settings is returned instead, and the
    reason is logged (one info line on rank 0) whenever a limit was weighed.

    Returns:
        The strategy to use (``strategy`` itself or a new FSDP one) and the choice (see
        :func:`auto_strategy_choice`).
    """
    from drivetrain.strategies.fsdp import FSDPStrategy

    choice = auto_strategy_choice(strategy, module)
    if choice is None:
        return strategy, None
    if choice.limit is not None:  # with no limit known nothing was weighed: DDP, as always
        get_logger(__name__).info(choice.reason)
    if choice.strategy == "ddp":
        return strategy, choice
    assert isinstance(strategy, DDPStrategy)
    sharded = FSDPStrategy(
        checkpoint_io=strategy.given_plugins().get("checkpoint_io"),
        **strategy.process_group_options.as_arguments(),
    )
    sharded.connect_plugins(
        accelerator=strategy.accelerator,
        precision=strategy.precision,
        checkpoint_io=None,
        cluster_environment=strategy.cluster_environment,
        parallel_devices=strategy.parallel_devices,
        num_nodes=strategy.num_nodes,
    )
    sharded.check_accelerator(strategy.accelerator)
    return sharded, choice


def auto_strategy_choice(strategy: Strategy, module: nn.Module) -> AutoStrategyChoice | None:
    """What ``strategy="auto"`` makes of ``strategy`` (what ``connect`` built) for ``module``, and why.

    The estimate counts parameter shapes only (a model on the meta device works; see
    :mod:`drivetrain.strategies.memory_estimate`). ``None`` where there is no choice to make: one
    process, a strategy other than the DDP that ``"auto"`` builds, or processes forked from a
    notebook (``ddp_notebook``), where reading a GPU's size would start CUDA before the fork.
    """

    if type(strategy) is not DDPStrategy or strategy.world_size < 2 or strategy.start_method != "popen":
        return None
    device = strategy.root_device
    return choose_data_parallel(
        module,
        strategy.precision.name,
        strategy.world_size,
        strategy.accelerator.training_memory(device),
        str(device),
    )


def _interactive() -> bool:
    """Whether the code runs from a prompt: ``python -i``/a REPL (``sys.ps1``), IPython or a Jupyter kernel."""
    if hasattr(sys, "ps1") or "ipykernel" in sys.modules:
        return True
    ipython = sys.modules.get("IPython")
    get_ipython = getattr(ipython, "get_ipython", None)
    return callable(get_ipython) and get_ipython() is not None
