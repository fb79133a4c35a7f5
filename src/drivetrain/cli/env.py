"""``drivetrain env``: what drivetrain sees here, and what ``"auto"`` resolves to and why."""

from __future__ import annotations

import argparse
import platform
from typing import Any

import torch

import drivetrain


def add_env_command(commands: Any) -> None:
    parser = commands.add_parser(
        "env",
        help="show the detected hardware, cluster environment, registered plugins and what 'auto' means here",
        description="Show the detected hardware, cluster environment, registered accelerators, strategies and "
        "precisions, and what accelerator/devices/strategy='auto' resolve to on this machine.",
    )
    parser.set_defaults(run=run_env)


def run_env(args: argparse.Namespace) -> int:
    print(describe_environment())
    return 0


def describe_environment() -> str:
    """The report ``drivetrain env`` prints."""
    from drivetrain.accelerators import AcceleratorRegistry
    from drivetrain.plugins.environments import detect_cluster_environment
    from drivetrain.plugins.precision import PrecisionRegistry
    from drivetrain.strategies import StrategyRegistry

    lines = [
        f"drivetrain {drivetrain.__version__} | torch {torch.__version__} | Python {platform.python_version()} | "
        f"{platform.system()} {platform.machine()}",
        "",
        "Hardware (registered accelerators):",
    ]
    for entry in AcceleratorRegistry.describe():
        lines.append(
            f"  {entry.name:<8} {_availability(entry.cls)}  - {entry.description or entry.cls.__name__}"
        )

    environment = detect_cluster_environment()
    lines += ["", f"Cluster environment: {type(environment).__name__}"]
    lines.append(f"  {_environment_facts(environment)}")

    lines += ["", "What 'auto' resolves to here:"]
    lines += [f"  {line}" for line in _auto_resolution()]

    lines += ["", "Registered strategies:"]
    for entry in StrategyRegistry.describe():
        options = ", ".join(f"{k}={v!r}" for k, v in entry.init_kwargs.items())
        lines.append(f"  {entry.name:<40} {entry.cls.__name__}({options})  - {entry.description}")
    lines += ["", "Registered precisions:"]
    for entry in PrecisionRegistry.describe():
        lines.append(f"  {entry.name:<12} {entry.cls.__name__}  - {entry.description}")
    return "\n".join(lines)


def _availability(cls: type) -> str:
    try:
        if not cls.is_available():  # type: ignore[attr-defined]
            return "not available".ljust(28)
        return f"available, {cls.auto_device_count()} device(s)".ljust(28)  # type: ignore[attr-defined]
    except Exception as error:  # a broken user plugin must not break the report
        return f"error: {type(error).__name__}: {error}"[:28].ljust(28)


def _environment_facts(environment: Any) -> str:
    try:
        external = environment.creates_processes_externally
        facts = (
            f"global rank {environment.global_rank()} of {environment.world_size()}, local rank "
            f"{environment.local_rank()}, node rank {environment.node_rank()}"
        )
        if external:
            return f"processes started externally; {facts}; rendezvous {environment.main_address}:{environment.main_port}"
        return f"no external launcher: drivetrain starts the processes itself; {facts}"
    except Exception as error:
        return f"could not read it: {type(error).__name__}: {error}"


def _auto_resolution() -> list[str]:
    from drivetrain.accelerators.selection import AUTO_PREFERENCE
    from drivetrain.connector import connect

    lines = [f"accelerator='auto' picks the first available of: {', '.join(AUTO_PREFERENCE)}, else cpu."]
    try:
        strategy = connect()
    except Exception as error:
        return [*lines, f"connect() with all defaults fails here: {type(error).__name__}: {error}"]
    accelerator = type(strategy.accelerator).__name__
    devices = getattr(strategy, "parallel_devices", [strategy.root_device])
    why = (
        "one device in one process"
        if strategy.world_size == 1
        else f"{strategy.world_size} processes, so data-parallel"
    )
    lines += [
        f"-> accelerator: {accelerator}",
        f"-> devices='auto': {len(devices)} ({', '.join(str(d) for d in devices)}), the accelerator's auto count",
        f"-> strategy='auto': {type(strategy).__name__} ({why})",
        f"-> precision: {strategy.precision.name}",
    ]
    strategy.teardown()
    return lines
