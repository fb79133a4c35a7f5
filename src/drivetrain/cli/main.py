"""The ``drivetrain`` command: ``launch``, ``config``, ``env``, ``consolidate`` (``merge-weights``),
``estimate-memory``, ``plot`` and ``--version``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def build_parser() -> argparse.ArgumentParser:
    import drivetrain

    parser = argparse.ArgumentParser(
        prog="drivetrain",
        description="Launch drivetrain training scripts and inspect what drivetrain sees on this machine.",
    )
    parser.add_argument("--version", action="version", version=f"drivetrain {drivetrain.__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands.required = True
    from drivetrain.cli.config import add_config_command
    from drivetrain.cli.consolidate import add_consolidate_command
    from drivetrain.cli.env import add_env_command
    from drivetrain.cli.estimate_memory import add_estimate_memory_command
    from drivetrain.cli.launch import add_launch_command
    from drivetrain.cli.plot import add_plot_command

    add_launch_command(commands)
    add_config_command(commands)
    add_env_command(commands)
    add_consolidate_command(commands)
    add_estimate_memory_command(commands)
    add_plot_command(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    return int(args.run(args) or 0)


if __name__ == "__main__":  # python -m drivetrain.cli.main
    sys.exit(main())
