"""``drivetrain env``: what drivetrain sees here, what ``"auto"`` resolves to and why, and which extras are installed."""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import platform
import re
import sys
from typing import Any

import drivetrain
from drivetrain.strategies.memory_estimate import format_bytes


def add_env_command(commands: Any) -> None:
    parser = commands.add_parser(
        "env",
        help="show the detected hardware, cluster environment, registered plugins, what 'auto' means here and "
        "the installed extras",
        description="Show the detected hardware, cluster environment, registered accelerators, strategies and "
        "precisions, what accelerator/devices/strategy='auto' resolve to on this machine, and which optional "
        "extras (drivetrain[tensorboard], drivetrain[wandb] ...) are installed.",
    )
    parser.add_argument(
        "--explain",
        action="store_true",
        help="also explain how strategy='auto' chooses between DDP and FSDP here (with --model: for that model)",
    )
    parser.add_argument(
        "--model",
        metavar="MODULE:CLASS",
        default=None,
        help="with --explain: the model to size (built on meta)",
    )
    parser.add_argument(
        "--init-args", "--init_args", dest="init_args", default="{}", help="its keyword arguments, JSON"
    )
    parser.add_argument(
        "-n",
        "--devices",
        type=int,
        default=2,
        help="with --explain --model: the processes to size for (default 2)",
    )
    parser.add_argument(
        "--precision", default="32-true", help="with --explain --model: the precision (default 32-true)"
    )
    parser.set_defaults(run=run_env)


def run_env(args: argparse.Namespace) -> int:
    if args.model is not None and not args.explain:
        print("drivetrain env: --model is used with --explain; add --explain.", file=sys.stderr)
        return 2
    print(describe_environment())
    if args.explain:
        try:
            lines = explain_auto_strategy(args.model, args.init_args, args.devices, args.precision)
        except (ValueError, TypeError) as error:
            print(f"drivetrain env --explain: {error}", file=sys.stderr)
            return 2
        print("\n".join(["", "How strategy='auto' chooses here:", *(f"  {line}" for line in lines)]))
    return 0


def explain_auto_strategy(model: str | None, init_args: str, devices: int, precision: str) -> list[str]:
    """The rule ``strategy="auto"`` follows, this machine's memory limit, and (given a model) its choice.

    Raises:
        ValueError: a model that cannot be built, bad ``init_args`` or a device count below 2.
    """
    from drivetrain.accelerators.cpu import MEMORY_LIMIT_VARIABLE
    from drivetrain.cli.estimate_memory import build_model
    from drivetrain.connector import auto_strategy_choice, connect

    lines = [
        "one process: SingleDeviceStrategy; XLA devices: 'xla'; several processes: DDP, unless the training "
        "state DDP keeps on every process (weights + gradients + Adam states, counted from parameter shapes) "
        "exceeds the device's training memory: then FSDP, which shards it. The choice is made when fit() "
        "gets the model (an info line on rank 0 gives the reason).",
    ]
    strategy = connect()
    device = strategy.root_device
    memory = strategy.accelerator.training_memory(device)
    strategy.teardown()
    if memory is None:
        lines.append(
            f"training memory of {device}: not known, so DDP always (on CPU set {MEMORY_LIMIT_VARIABLE}=8GiB, or "
            f"pass accelerator=CPUAccelerator(memory_limit='8GiB'))."
        )
    else:
        lines.append(f"training memory of {device}: {format_bytes(memory[0])} ({memory[1]}).")
    if model is None:
        return lines
    arguments = json.loads(init_args)
    if not isinstance(arguments, dict):
        raise ValueError("--init-args must be a JSON object of keyword arguments, e.g. '{\"width\": 64}'.")
    if devices < 2:
        raise ValueError(
            f"--devices {devices}: 'auto' only chooses between DDP and FSDP for 2 or more processes."
        )
    built = build_model(model, arguments)
    sized = connect(devices=devices, precision=precision)
    try:
        choice = auto_strategy_choice(sized, built)
    finally:
        sized.teardown()
    lines.append(f"{model} on {devices} processes: " + (choice.reason if choice else "no choice to make."))
    return lines


def describe_environment() -> str:
    """The report ``drivetrain env`` prints."""
    import torch  # here, not at the top: `drivetrain --help` builds this command's parser without torch

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
    lines += ["", "Optional extras (pip install 'drivetrain[NAME]'):"]
    lines += [f"  {line}" for line in describe_extras()]
    return "\n".join(lines)


#: Extras that only group others (``all``) or serve development (``dev``, ``docs``): not features to report.
_GROUPING_EXTRAS = ("all", "dev", "docs")


def extras_status() -> dict[str, dict[str, str | None]]:
    """For each extra of the installed drivetrain: its packages and their installed versions (``None``: missing).

    Read from the installed package's metadata, so the report follows ``pyproject.toml``.
    """
    try:
        metadata = importlib.metadata.metadata("drivetrain")
        requirements = importlib.metadata.requires("drivetrain") or []
    except importlib.metadata.PackageNotFoundError:  # running from a source tree that was never installed
        return {}
    extras: dict[str, dict[str, str | None]] = {
        name: {} for name in metadata.get_all("Provides-Extra") or [] if name not in _GROUPING_EXTRAS
    }
    for requirement in requirements:
        marker = re.search(r"""extra\s*==\s*["']([^"']+)["']""", requirement)
        if marker is None or marker.group(1) not in extras:
            continue
        package = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", requirement)
        if package is None or package.group(0) == "drivetrain":
            continue
        extras[marker.group(1)][package.group(0)] = _installed_version(package.group(0))
    return extras


def describe_extras() -> list[str]:
    """One line per extra: installed (with versions) or which packages are missing."""
    status = extras_status()
    if not status:
        return ["(drivetrain is not installed as a package here; its extras cannot be read)"]
    width = max(len(name) for name in status)
    lines = []
    for name, packages in status.items():
        missing = [package for package, version in packages.items() if version is None]
        if missing:
            state = f"missing: {', '.join(missing)}"
        else:
            state = "installed (" + ", ".join(f"{p} {v}" for p, v in packages.items()) + ")"
        lines.append(f"{name:<{width}}  {state}")
    return lines


def _installed_version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


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
