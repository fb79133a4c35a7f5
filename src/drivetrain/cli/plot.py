"""``drivetrain plot RUN_DIR``: a PNG of a run's logged curves (from metrics.csv or TensorBoard event files)."""

from __future__ import annotations

import argparse
import sys
from typing import Any


def add_plot_command(commands: Any) -> None:
    parser = commands.add_parser(
        "plot",
        help="write a PNG of a run's logged metrics (needs drivetrain[plot])",
        description="Write a PNG of the curves a run logged (metrics.csv of a CSVLogger, or the event files of a "
        "TensorBoardLogger): one axis per metric group (train/val loss together, each other metric on its "
        "own), by step, with epochs along the top. Needs matplotlib: pip install 'drivetrain[plot]'.",
    )
    parser.add_argument(
        "run_dir",
        metavar="RUN_DIR",
        help="the run's folder (e.g. drivetrain_logs/version_0) or its metrics.csv",
    )
    parser.add_argument(
        "-o", "--output", default=None, help="where to write the PNG (default: RUN_DIR/metrics.png)"
    )
    parser.set_defaults(run=run_plot)


def run_plot(args: argparse.Namespace) -> int:
    from drivetrain._utilities.paths import is_remote
    from drivetrain.loggers.plot import plot_run

    try:
        result = plot_run(args.run_dir, args.output)
    except (FileNotFoundError, ValueError, ImportError) as error:
        print(f"drivetrain plot: {error}", file=sys.stderr)
        return 1
    groups = ", ".join(f"{group} ({len(names)})" for group, names in result.groups.items())
    print(f"drivetrain plot: wrote {result.path} with {len(result.groups)} axes: {groups}")
    if is_remote(result.path):
        # Beside the remote run, not on this machine: say so, and how to get a local copy.
        print(
            f"drivetrain plot: the PNG is in remote storage, next to the run; to write it here instead: "
            f"drivetrain plot {args.run_dir} -o metrics.png"
        )
    return 0
