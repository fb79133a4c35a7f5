"""``drivetrain check-plugin PACKAGE_OR_MODULE:CLASS``: the conformance kit from the command line.

Prints one table per plugin (every check passed, failed with the reason and what to implement, or
not applicable and why) and exits 1 when any check failed. ``--contract-only`` runs the contract
checks alone (seconds); without it the whole programs run too (a minute or two per plugin).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

_EXAMPLES = """examples:
  drivetrain check-plugin my_package.xpu:XPUAccelerator --fake        # no XPU here: CPU tensors behind 'xpu'
  drivetrain check-plugin my_package                                   # every plugin class my_package defines
  drivetrain check-plugin my_presets:ddp_custom_checkpoint_io          # a strategy preset the module registers
  drivetrain check-plugin hpu --fake --contract-only                   # a registered name, contract checks only
  drivetrain check-plugin my_cluster:MyEnvironment --env MYSCHED_RANK={rank} --env MYSCHED_NTASKS={world_size}
"""


def add_check_plugin_command(commands: Any) -> None:
    parser = commands.add_parser(
        "check-plugin",
        help="check an accelerator, strategy, precision, checkpoint IO or cluster environment plugin",
        description=__doc__,
        epilog=_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("target", help="module:Class (or module:attribute, a module, or a registered name)")
    parser.add_argument(
        "--kind",
        choices=("accelerator", "strategy", "precision"),
        default=None,
        help="for a registered name several registries hold (xla: the accelerator unless --kind strategy); "
        "checkpoint IOs and cluster environments have no registry: give them as module:Class",
    )
    parser.add_argument(
        "--fake", action="store_true", help="run an accelerator whose hardware is absent on CPU tensors"
    )
    parser.add_argument(
        "--stand-in",
        default="auto",
        help="the device library's stand-in with --fake: auto, cuda, xpu, mps, xla, hpu, module:Class or none",
    )
    parser.add_argument(
        "--devices",
        type=int,
        default=2,
        help="devices (processes) for the multi-process programs (default 2)",
    )
    parser.add_argument(
        "--accelerator", default="cpu", help="the accelerator a strategy or precision runs on (default cpu)"
    )
    parser.add_argument(
        "--processes",
        type=_process_counts,
        default=None,
        help="process counts for the programs, e.g. 1,2 (default both)",
    )
    parser.add_argument(
        "--contract-only", action="store_true", help="skip the whole programs (the fast checks only)"
    )
    parser.add_argument("--no-cli", action="store_true", help="skip the training-CLI program")
    parser.add_argument(
        "--path", default=None, help="where a checkpoint IO writes in its checks (a folder or URL)"
    )
    parser.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a cluster environment's variable (repeat)",
    )
    parser.add_argument(
        "--world-size",
        type=_at_least_one,
        default=2,
        help="processes of the job for a cluster environment (default 2)",
    )
    parser.add_argument(
        "--timeout", type=float, default=300.0, help="seconds each program may run (default 300)"
    )
    parser.add_argument(
        "--root", default=None, help="where the programs' folders go (default: a temporary folder)"
    )
    parser.set_defaults(run=run_check_plugin)


def _at_least_one(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"a whole number of processes, at least 1, is needed; got {text!r}")
    return value


def _process_counts(text: str) -> list[int]:
    try:
        return [_at_least_one(part.strip()) for part in text.split(",")]
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(
            f"process counts separated by commas, each at least 1, e.g. 1,2; got {text!r}"
        ) from None


def run_check_plugin(args: argparse.Namespace) -> int:
    from drivetrain.testing.command import check_plugin

    env = {}
    for item in args.env:
        name, sep, value = item.partition("=")
        if not sep or not name:
            print(f"drivetrain check-plugin: --env takes NAME=VALUE, got {item!r}.", file=sys.stderr)
            return 2
        env[name] = value
    processes = args.processes
    try:
        reports = check_plugin(
            args.target,
            kind=args.kind,
            fake=args.fake,
            stand_in=None if args.stand_in == "none" else args.stand_in,
            devices=args.devices,
            accelerator=args.accelerator,
            whole_programs=not args.contract_only,
            processes=processes,
            cli=not args.no_cli,
            path_or_url=args.path,
            env=env or None,
            world_size=args.world_size,
            timeout=args.timeout,
            root=args.root,
        )
    except (ValueError, ImportError) as error:
        print(f"drivetrain check-plugin: {error}", file=sys.stderr)
        return 2
    for report in reports:
        print(report)
        print()
    return 0 if all(report.ok for report in reports) else 1
