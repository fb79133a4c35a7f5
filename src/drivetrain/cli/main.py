"""The ``drivetrain`` command: ``launch``, ``config``, ``env``, ``consolidate`` (``merge-weights``),
``estimate-memory``, ``plot``, ``check-plugin`` and ``--version``."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

#: The commands, in the order ``drivetrain --help`` lists them: (names, module, function adding it).
_COMMANDS: tuple[tuple[tuple[str, ...], str, str], ...] = (
    (("launch",), "drivetrain.cli.launch", "add_launch_command"),
    (("config",), "drivetrain.cli.config", "add_config_command"),
    (("env",), "drivetrain.cli.env", "add_env_command"),
    (("consolidate", "merge-weights"), "drivetrain.cli.consolidate", "add_consolidate_command"),
    (("estimate-memory",), "drivetrain.cli.estimate_memory", "add_estimate_memory_command"),
    (("plot",), "drivetrain.cli.plot", "add_plot_command"),
    (("check-plugin",), "drivetrain.cli.check_plugin", "add_check_plugin_command"),
)


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The command line's parser; with ``command`` (a known name), only that command's part.

    ``drivetrain launch …`` then imports nothing of the other commands (their modules and what
    they use), which its ranks would otherwise wait for: the launch starts them after parsing.
    """
    import drivetrain

    parser = argparse.ArgumentParser(
        prog="drivetrain",
        description="Launch drivetrain training scripts and inspect what drivetrain sees on this machine.",
    )
    parser.add_argument("--version", action="version", version=f"drivetrain {drivetrain.__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands.required = True
    for names, module, adder in _COMMANDS:
        if command is None or command in names:
            getattr(importlib.import_module(module), adder)(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    arguments = list(sys.argv[1:] if argv is None else argv)
    known = {name for names, _, _ in _COMMANDS for name in names}
    # An unknown or missing command gets the whole parser: its error and help list every command.
    parser = build_parser(arguments[0] if arguments and arguments[0] in known else None)
    args = parser.parse_args(arguments)
    return int(args.run(args) or 0)


if __name__ == "__main__":  # python -m drivetrain.cli.main
    sys.exit(main())
