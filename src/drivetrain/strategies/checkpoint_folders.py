"""Writing a checkpoint folder from every rank, published only once every rank's part is in and verified.

Sharded strategies (FSDP through ``torch.distributed.checkpoint``, DeepSpeed's engine) write a
folder to which every rank contributes files. :func:`staged_folder` gives them a hidden staging
folder next to the target, agreed on by all ranks; when every rank has written its part, global
rank 0 verifies the folder and publishes it under its real name
(:func:`drivetrain.plugins.io.atomic.publish_folder`). Until then the previous checkpoint of that
name is untouched, and a crash at any moment leaves either it or the new one, never half of one.

The outcome is shared: if any rank fails to write, or rank 0 fails to verify or publish, every
rank raises (no rank is left waiting in a collective), and the staging folder is removed.

On remote storage (an fsspec URL) there is no atomic folder rename: rank 0 removes a previous
checkpoint of the same name (its completion marker first), every rank writes into ``path``
itself, and rank 0 publishes by writing the completion marker once the folder is verified
(:func:`drivetrain.plugins.io.atomic.complete_remote_folder`). Readers take a remote folder only
with its marker, so a crash at any moment leaves no half checkpoint that looks whole; resuming
then picks the newest complete one.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from drivetrain._utilities import paths
from drivetrain.plugins.io.atomic import (
    complete_remote_folder,
    local_path,
    new_token,
    partial_path,
    publish_folder,
    remove,
    tidy,
)

if TYPE_CHECKING:
    from drivetrain.strategies.strategy import Strategy


class CheckpointWriteError(RuntimeError):
    """Another rank failed while a checkpoint folder was being written or published."""


@contextmanager
def staged_folder(
    strategy: Strategy,
    path: str | Path,
    verify: Callable[[Any], None] | None = None,
    storage_options: Any | None = None,
) -> Iterator[Any]:
    """Yield the folder every rank writes into; publish it as ``path`` when all are done.

    Every rank must enter and leave the context (it holds collectives). ``verify(folder)`` runs
    on global rank 0 before publishing and raises if the folder is not complete. The folder is a
    local :class:`~pathlib.Path` (a hidden staging folder), or for a remote ``path`` the URL of
    ``path`` itself.

    Raises:
        CheckpointWriteError: on the ranks that did not fail themselves, when one did.
    """
    remote = paths.is_remote(path)
    zero = strategy.is_global_zero
    token = strategy.broadcast(new_token() if zero else None)
    staging: Any = os.fspath(path) if remote else partial_path(local_path(path), token)
    setup_failure = None
    if zero:
        try:
            if remote:
                tidy(paths.parent(staging), storage_options)
                remove(staging, storage_options)
                paths.makedirs(staging, storage_options)
            else:
                staging.parent.mkdir(parents=True, exist_ok=True)
                tidy(staging.parent)
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
            _discard(staging, storage_options)
        if mine is not None:
            raise mine
        raise CheckpointWriteError(f"Writing the checkpoint '{path}' failed on {'; '.join(failed)}.")
    publish_failure, publish_error = None, None
    if zero:
        try:
            if verify is not None:
                verify(staging)
            if remote:
                complete_remote_folder(staging, storage_options)
            else:
                publish_folder(staging, local_path(path), token)
        except Exception as raised:
            _discard(staging, storage_options)
            publish_failure, publish_error = f"{type(raised).__name__}: {raised}", raised
    _agree(strategy, publish_failure, staging, publish_error)


def _discard(staging: Any, storage_options: Any | None) -> None:
    if isinstance(staging, Path):
        shutil.rmtree(staging, ignore_errors=True)
    else:
        remove(staging, storage_options)


def _agree(strategy: Strategy, failure: str | None, staging: Any, error: BaseException | None = None) -> None:
    """Share rank 0's failure (or success) with every rank; raise everywhere on failure."""
    shared: Any = strategy.broadcast(failure) if strategy.world_size > 1 else failure
    if shared is None:
        return
    if error is not None:
        raise error
    raise CheckpointWriteError(f"Publishing the checkpoint from '{staging}' failed on rank 0: {shared}")
