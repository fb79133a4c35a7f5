"""``drivetrain consolidate SRC DST`` (or ``merge-weights``, Accelerate's name): one file from a sharded checkpoint.

``SRC`` is a directory written by ``FSDPStrategy.save_state`` (sharded, through
``torch.distributed.checkpoint``) or by ``DeepSpeedStrategy.save_state``, or the folder given to
``Accelerator.save_state`` (the sharded ``state.ckpt`` inside it is found); ``DST`` is the file to
write, loadable with ``torch.load(DST, weights_only=True)`` in one process. Runs without a GPU
or a process group; it needs memory for the whole model. ``SRC`` is read safely (no code from
the files runs); ``--no-weights-only`` lifts that for checkpoints from a trusted source. An FSDP
``SRC`` and ``DST`` may be remote (``s3://bucket/run/last.ckpt``, any fsspec URL).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any


def add_consolidate_command(commands: Any) -> None:
    parser = commands.add_parser(
        "consolidate",
        aliases=["merge-weights"],  # Accelerate's name for the same job
        help="gather an FSDP or DeepSpeed sharded checkpoint into one file loadable on a single device",
        description="Gather the sharded checkpoint directory SRC (written by FSDPStrategy or DeepSpeedStrategy) "
        "into the single file DST, loadable with torch.load(DST, weights_only=True).",
    )
    parser.add_argument(
        "source",
        metavar="SRC",
        help="the sharded checkpoint directory, or the folder given to Accelerator.save_state (an FSDP one may be "
        "remote: s3://...)",
    )
    parser.add_argument("destination", metavar="DST", help="the file to write (local or remote)")
    parser.add_argument(
        "--no-weights-only",
        dest="weights_only",
        action="store_false",
        help="unpickle SRC without restrictions (can run code from the files: only for checkpoints you trust)",
    )
    parser.set_defaults(run=run_consolidate)


def run_consolidate(args: argparse.Namespace) -> int:
    from drivetrain.plugins.io.safe_loading import UnsafeCheckpointError
    from drivetrain.strategies.consolidate import checkpoint_kind, consolidate_checkpoint

    try:
        kind = checkpoint_kind(args.source)
        written = consolidate_checkpoint(args.source, args.destination, weights_only=args.weights_only)
    except UnsafeCheckpointError as error:
        print(f"drivetrain consolidate: {error.with_opt_out('--no-weights-only')}", file=sys.stderr)
        return 2
    except (FileNotFoundError, ValueError, ImportError) as error:  # DamagedCheckpointError is a ValueError
        print(f"drivetrain consolidate: {error}", file=sys.stderr)
        return 2
    print(f"drivetrain consolidate: wrote the {kind} checkpoint {args.source} to {written}")
    return 0
