"""The strategy's contract: its constructor's plugins, its wiring by ``connect()``, and its declarations.

What needs processes (collectives, and whether what a strategy declares matches what it does once
set up) is checked inside the kit's programs; see :mod:`drivetrain.testing.collectives`.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch

from drivetrain.connector import connect
from drivetrain.strategies import ParallelStrategy, Strategy, StrategyRegistry
from drivetrain.testing.contracts import Check, NotApplicable

_FLAGS = (
    "owns_accumulation",
    "compiles_models",
    "wraps_models",
    "requires_joint_setup",
    "supports_inference_mode",
    "forward_is_collective",
)
_MULTI_PROCESS_KINDS = ("parallel", "ddp", "fsdp", "model_parallel")


def registered_names(cls: type) -> list[str]:
    """The strategy registry's names whose class is ``cls``."""
    return [entry.name for entry in StrategyRegistry.describe() if entry.cls is cls]


def strategy_checks(cls: Any, make: Callable[..., Any], accelerator: str) -> list[Check]:
    """The checks for strategy class ``cls``; ``make(**plugins)`` builds one (from the registry's preset, or the class)."""
    state: dict[str, Any] = {}

    def subclass() -> str | None:
        if not (isinstance(cls, type) and issubclass(cls, Strategy)):
            return f"{cls!r} is not a subclass of drivetrain.strategies.Strategy"
        return None

    def constructor() -> str | None:
        from drivetrain.accelerators import AcceleratorRegistry
        from drivetrain.plugins import LocalEnvironment, Precision, TorchCheckpointIO

        plugins: dict[str, Any] = {
            "accelerator": AcceleratorRegistry.get(accelerator),
            "checkpoint_io": TorchCheckpointIO(),
            "precision_plugin": Precision(),
        }
        takes = inspect.signature(cls.__init__).parameters
        if issubclass(cls, ParallelStrategy) and "cluster_environment" in takes:
            plugins["cluster_environment"] = LocalEnvironment()  # (XLA's ranks come from its runtime instead)
        try:
            built = make(**plugins)
        except TypeError as error:
            return f"building it with {', '.join(f'{k}=...' for k in plugins)} raised TypeError: {error}"
        given = built.given_plugins()
        wanted = {"precision" if k == "precision_plugin" else k: v for k, v in plugins.items()}
        lost = [name for name, plugin in wanted.items() if given.get(name) is not plugin]
        if lost:
            return f"given_plugins() does not report the {', '.join(lost)} passed to the constructor (connect() would replace them)"
        return None

    def wired() -> str | None:

        built = make()
        strategy = connect(accelerator=accelerator, strategy=built, devices=1)
        if strategy is not built:
            return "connect(strategy=instance) returned another object"
        state["strategy"] = strategy
        for name in ("accelerator", "precision", "checkpoint_io"):
            if getattr(strategy, name, None) is None:
                return f"after connect(), strategy.{name} is None"
        if not isinstance(strategy.root_device, torch.device):
            return f"root_device is {strategy.root_device!r}, not a torch.device"
        return None

    def declarations() -> str | None:
        strategy = state["strategy"]
        kind = strategy.kind
        if not isinstance(kind, str) or not kind:
            return f"kind is {kind!r}; declare a name such as 'ddp' or 'single_device'"
        wrong = [
            f"{flag}={getattr(strategy, flag)!r}"
            for flag in _FLAGS
            if not isinstance(getattr(strategy, flag), bool)
        ]
        if wrong:
            return f"these declarations are not True/False: {', '.join(wrong)}"
        parallel = isinstance(strategy, ParallelStrategy)
        if not parallel and kind in _MULTI_PROCESS_KINDS:
            return f"kind={kind!r} declares several processes, but {cls.__name__} is not a ParallelStrategy (it runs one)"
        if parallel and kind == "single_device":
            return f"kind='single_device', but {cls.__name__} is a ParallelStrategy"
        return None

    def single_process_setup() -> str | NotApplicable | None:
        strategy = state["strategy"]
        if isinstance(strategy, ParallelStrategy):
            return NotApplicable("a ParallelStrategy sets up a process group: checked in the programs below")
        strategy.setup_environment()
        module = torch.nn.Linear(2, 1)
        set_up = strategy.setup_module(module)
        wrapped = strategy.unwrap_module(set_up) is not set_up
        if wrapped != strategy.wraps_models:
            return (
                f"wraps_models={strategy.wraps_models}, but setup_module() returned "
                f"{'a wrapper around' if wrapped else 'the module itself, not a wrapper of'} the module"
            )
        return None

    def registered() -> str | NotApplicable | None:
        names = registered_names(cls)
        if not names:
            return NotApplicable(
                f"{cls.__name__} is not registered: it is used as an instance (strategy={cls.__name__}()); define "
                f"the classmethod register_strategies to give it a name for the CLI and config files"
            )
        for name in names:
            StrategyRegistry.get(name)  # the preset builds
        state["names"] = names
        return None

    return [
        Check(
            "strategy: subclasses Strategy",
            subclass,
            "subclass drivetrain.strategies.Strategy, SingleDeviceStrategy or ParallelStrategy",
            essential=True,
        ),
        Check(
            "strategy: takes its plugins in the constructor",
            constructor,
            "accept accelerator=, precision_plugin= (or precision=), checkpoint_io= (and cluster_environment= for a ParallelStrategy) and pass them to super().__init__; override given_plugins() if you keep them elsewhere",
        ),
        Check(
            "strategy: connect() wires it with an accelerator, precision and checkpoint IO",
            wired,
            "let connect_plugins() keep what connect() gives (call super().connect_plugins(...) if you override it)",
            essential=True,
        ),
        Check(
            "strategy: declarations are well formed (kind, owns_accumulation …)",
            declarations,
            "declare the capabilities of drivetrain.strategies.capabilities.StrategyCapabilities as docs/extending.md ('What a strategy declares') says",
        ),
        Check(
            "strategy: one-process set-up matches wraps_models",
            single_process_setup,
            "declare wraps_models = True exactly when setup_module() returns a wrapper (DDP's) around the module",
        ),
        Check(
            "strategy: registered under a short name",
            registered,
            "register presets in the classmethod register_strategies(cls, strategy_registry)",
        ),
    ]
