"""Crash-safe checkpoint writes: write under a temporary name, verify, publish atomically, then prune.

A checkpoint becomes visible under its name only when it is complete. Everything in between
lives under hidden names in the same folder (a rename is atomic only within one file system)::

    .<name>.drivetrain-partial-<token>   a write in progress, or one a crash interrupted
    .<name>.drivetrain-old-<token>       the previous <name> (a folder), moved aside while replaced
    .<name>.drivetrain-deleted-<token>   a checkpoint being pruned

Publishing a file is one ``os.replace``. A folder (sharded checkpoint) cannot be replaced in one
step, so the old one is renamed aside first: between the two renames ``<name>`` is missing, but
the verified new folder and the old one both exist, and :func:`resolve` (for readers) and
:func:`tidy` (at the next save) finish the publish. Pruning renames before deleting, so a crash
never leaves half a checkpoint under a real name. :func:`tidy` removes what crashed writes left
behind, except the temporary files this process is still writing (background saves).

Only local paths are handled here; a path with a scheme (``s3://…``) is refused rather than
written to a local folder named after the scheme.
"""

from __future__ import annotations

import os
import pickle
import re
import secrets
import shutil
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

_TEMPORARY = re.compile(r"^\.(?P<name>.+)\.drivetrain-(?P<kind>partial|old|deleted)-(?P<token>[0-9a-f]{12})$")
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]+://")

# Temporary paths this process is writing right now (the background thread of AsyncCheckpointIO
# may be writing one while the training thread tidies the same folder).
_in_flight: set[str] = set()
_in_flight_lock = threading.Lock()


def local_path(path: str | os.PathLike[str]) -> Path:
    """``path`` as a local :class:`~pathlib.Path`; a URL is an error, never a folder named ``s3:``."""
    text = os.fspath(path)
    if _SCHEME.match(text):
        raise ValueError(
            f"'{text}' is a remote path; drivetrain writes checkpoints to the local file system only so far. "
            f"Write to a local (or mounted) path and copy the result, or use a CheckpointIO that handles this "
            f"storage."
        )
    return Path(text)


def new_token() -> str:
    return secrets.token_hex(6)


def partial_path(path: Path, token: str) -> Path:
    return path.with_name(f".{path.name}.drivetrain-partial-{token}")


def _old_path(path: Path, token: str) -> Path:
    return path.with_name(f".{path.name}.drivetrain-old-{token}")


def is_temporary(name: str) -> bool:
    """Whether ``name`` is one of this module's hidden temporary names."""
    return _TEMPORARY.match(name) is not None


@contextmanager
def in_flight(path: Path) -> Iterator[Path]:
    """Mark ``path`` as being written by this process, so :func:`tidy` leaves it alone."""
    key = os.fspath(path)
    with _in_flight_lock:
        _in_flight.add(key)
    try:
        yield path
    finally:
        with _in_flight_lock:
            _in_flight.discard(key)


# -- publishing -----------------------------------------------------------------------------------
def fsync_file(path: Path) -> None:
    with open(path, "rb") as file:
        os.fsync(file.fileno())


def fsync_directory(directory: Path) -> None:
    """Make renames in ``directory`` durable (a no-op where directories cannot be opened, e.g. Windows)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def publish_file(written: Path, path: Path) -> None:
    """Atomically make the complete, flushed file ``written`` the file ``path`` (replacing any old one)."""
    os.replace(written, path)
    fsync_directory(path.parent)


def write_file(path: str | os.PathLike[str], write: Callable[[Path], None]) -> None:
    """Write a file crash-safely: ``write(temporary)``, flush it to disk, then rename it to ``path``.

    On any error the temporary file is removed and whatever was at ``path`` stays.
    """
    path = local_path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with in_flight(partial_path(path, new_token())) as tmp:
        try:
            write(tmp)
            fsync_file(tmp)
            publish_file(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise


def publish_folder(staging: Path, path: Path, token: str) -> None:
    """Make the complete folder ``staging`` the checkpoint ``path``, then remove the one it replaces.

    The files are flushed to disk first, so the renamed folder is whole even after a power cut.
    """
    for file in sorted(p for p in staging.rglob("*") if p.is_file()):
        fsync_file(file)
    for directory in sorted({p.parent for p in staging.rglob("*")} | {staging}):
        fsync_directory(directory)
    previous = None
    if path.is_symlink() or path.is_file():
        path.unlink()  # not a folder checkpoint: nothing to keep while replacing it
    elif path.exists():
        previous = _old_path(path, token)
        os.rename(path, previous)
    os.rename(staging, path)
    fsync_directory(path.parent)
    if previous is not None:
        shutil.rmtree(previous, ignore_errors=True)


def remove(path: str | os.PathLike[str]) -> None:
    """Delete a checkpoint file or folder; a folder is renamed aside first, so a crash never leaves half of it."""
    path = Path(path)
    if path.is_symlink() or path.is_file():
        path.unlink(missing_ok=True)
        return
    if not path.exists():
        return  # pruning is idempotent: a retried or concurrent removal succeeds
    doomed = path.with_name(f".{path.name}.drivetrain-deleted-{new_token()}")
    try:
        os.rename(path, doomed)
    except FileNotFoundError:  # removed concurrently
        return
    shutil.rmtree(doomed, ignore_errors=True)


# -- finding what was published, cleaning what crashed --------------------------------------------
def resolve(path: str | os.PathLike[str]) -> Path | None:
    """Where the checkpoint published as ``path`` is, even if a crash interrupted its replacement.

    ``path`` itself when it exists. Otherwise, if a folder publish stopped between its two renames,
    the new folder (complete: it was verified before the old one was moved) or, failing that, the
    old one. ``None`` when there is nothing. Changes nothing on disk (readers on every rank call it).
    """
    path = Path(path)
    if path.exists():
        return path
    try:
        siblings = os.listdir(path.parent)
    except OSError:
        return None
    for name in sorted(siblings):
        match = _TEMPORARY.match(name)
        if match is None or match["name"] != path.name or match["kind"] != "old":
            continue
        new = partial_path(path, match["token"])
        return new if new.exists() else path.parent / name
    return None


def tidy(directory: str | os.PathLike[str]) -> None:
    """Finish interrupted folder publishes in ``directory`` and delete what crashed writes left there.

    Called before each save into ``directory`` (by one process). Temporary files this process is
    writing are kept.
    """
    directory = Path(directory)
    try:
        names = os.listdir(directory)
    except OSError:
        return
    leftovers = [(name, match) for name in names if (match := _TEMPORARY.match(name)) is not None]
    for name, match in leftovers:
        target = directory / match["name"]
        if match["kind"] != "old" or target.exists():
            continue
        new = partial_path(target, match["token"])
        try:
            os.rename(new if new.exists() else directory / name, target)
        except OSError:
            pass  # another process finished it first
    with _in_flight_lock:
        keep = set(_in_flight)
    for name, _ in leftovers:
        leftover = directory / name
        if os.fspath(leftover) in keep or not (leftover.exists() or leftover.is_symlink()):
            continue
        if leftover.is_dir() and not leftover.is_symlink():
            shutil.rmtree(leftover, ignore_errors=True)
        else:
            leftover.unlink(missing_ok=True)


def is_complete(path: str | os.PathLike[str]) -> bool:
    """Whether the checkpoint at ``path`` (a file or a sharded folder) is whole, judged from its structure.

    A file must be a complete ``torch.save`` archive; a folder must hold at least one file, every
    ``.pt`` file in it must be complete, and a DCP ``.metadata`` must read (safely) and match its
    data files. Cheap: reads archive indexes and metadata, not tensor data.
    """
    from drivetrain.plugins.io.safe_loading import DamagedCheckpointError, check_torch_file, read_dcp_metadata

    path = Path(path)
    try:
        if path.is_file():
            check_torch_file(path)
            return True
        if not path.is_dir():
            return False
        files = [p for p in path.rglob("*") if p.is_file()]
        for file in files:
            if file.suffix == ".pt":
                check_torch_file(file)
        if (path / ".metadata").is_file():
            read_dcp_metadata(path)
        return bool(files)
    except (DamagedCheckpointError, OSError, pickle.UnpicklingError):
        return False
