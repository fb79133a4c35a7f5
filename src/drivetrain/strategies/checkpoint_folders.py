"""Writing a checkpoint folder from every rank, published only once every rank's part is in and verified.

Sharded strategies (FSDP through ``torch.distributed.checkpoint``, DeepSpeed's engine) write a
folder to which every rank contributes files. :func:`staged_folder` gives them a hidden staging
folder next to the target, agreed on by all ranks; when every rank has written its part, global
rank 0 verifies the folder and publishes it under its real name
(:func:`drivetrain.plugins.io.atomic.publish_folder`). Until then the previous checkpoint of that
name is untouched, and a crash at any moment leaves either it or the new one, never half of one.

The outcome is shared: if any rank fails to write, or rank 0 fails to verify or publish, every
rank raises (no rank is left waiting in a collective), and the staging folder is removed.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from drivetrain.plugins.io.atomic import local_path, new_token, partial_path, publish_folder, tidy

if TYPE_CHECKING:
    from drivetrain.strategies.strategy import Strategy


class CheckpointWriteError(RuntimeError):
    """Another rank failed while a checkpoint folder was being written or published."""


@contextmanager
def staged_folder(
    strategy: Strategy, path: str | Path, verify: Callable[[Path], None] | None = None
) -> Iterator[Path]:
    """Yield the staging folder every rank writes into; publish it as ``path`` when all are done.

    Every rank must enter and leave the context (it holds collectives). ``verify(staging)`` runs
    on global rank 0 before publishing and raises if the folder is not complete.

    Raises:
        CheckpointWriteError: on the ranks that did not fail themselves, when one did.
    """
    target = local_path(path)
    zero = strategy.is_global_zero
    token = strategy.broadcast(new_token() if zero else None)
    staging = partial_path(target, token)
    setup_failure = None
    if zero:
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            tidy(target.parent)
            staging.mkdir()
        except OSError as raised:
            setup_failure = f"rank 0 could not create '{staging}': {raised}"
    _agree(strategy, setup_failure, staging, None)
    mine: BaseException | None = None
    try:
        yield staging
    except BaseException as raised:
        mine = raised
    written = strategy.all_gather_object(None if mine is None else f"{type(mine).__name__}: {mine}")
    failed = [f"rank {rank}: {text}" for rank, text in enumerate(written) if text is not None]
    if failed:
        if zero:
            shutil.rmtree(staging, ignore_errors=True)
        if mine is not None:
            raise mine
        raise CheckpointWriteError(f"Writing the checkpoint '{target}' failed on {'; '.join(failed)}.")
    publish_failure, publish_error = None, None
    if zero:
        try:
            if verify is not None:
                verify(staging)
            publish_folder(staging, target, token)
        except Exception as raised:
            shutil.rmtree(staging, ignore_errors=True)
            publish_failure, publish_error = f"{type(raised).__name__}: {raised}", raised
    _agree(strategy, publish_failure, staging, publish_error)


def _agree(
    strategy: Strategy, failure: str | None, staging: Path, error: BaseException | None = None
) -> None:
    """Share rank 0's failure (or success) with every rank; raise everywhere on failure."""
    shared: Any = strategy.broadcast(failure) if strategy.world_size > 1 else failure
    if shared is None:
        return
    if error is not None:
        raise error
    raise CheckpointWriteError(f"Publishing the checkpoint from '{staging}' failed on rank 0: {shared}")
