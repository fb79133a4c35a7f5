"""Arguments that launchers append to a training script's command line, which the script must not see.

DeepSpeed's launcher (``deepspeed train.py``) and the old ``torch.distributed.launch`` append
``--local_rank=N`` to every process's arguments, and also set the ``LOCAL_RANK`` environment
variable, which is what drivetrain reads. A training script's parser knows nothing of
``--local_rank`` and would stop with "unrecognized arguments"; drivetrain's argument parsing
drops it first (:func:`drop_launcher_arguments`), and user scripts with their own ``argparse``
can do the same::

    args = parser.parse_args(drop_launcher_arguments(sys.argv[1:]))
"""

from __future__ import annotations

from collections.abc import Sequence

#: The spellings launchers use (DeepSpeed: ``--local_rank=N``; torch.distributed.launch: both).
LOCAL_RANK_FLAGS = ("--local_rank", "--local-rank")


def drop_launcher_arguments(argv: Sequence[str]) -> list[str]:
    """``argv`` without ``--local_rank=N`` / ``--local_rank N`` (or ``--local-rank``).

    Everything after a bare ``--`` is left alone: it belongs to the script, not to a launcher.
    """
    kept: list[str] = []
    arguments = list(argv)
    index = 0
    while index < len(arguments):
        argument = arguments[index]
        if argument == "--":
            kept.extend(arguments[index:])
            break
        if argument in LOCAL_RANK_FLAGS and index + 1 < len(arguments) and arguments[index + 1].isdigit():
            index += 2
            continue
        flag, _, value = argument.partition("=")
        if flag in LOCAL_RANK_FLAGS and value.isdigit():
            index += 1
            continue
        kept.append(argument)
        index += 1
    return kept
