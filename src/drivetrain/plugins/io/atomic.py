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

Remote paths (``s3://…``, any fsspec URL; see :mod:`drivetrain._utilities.paths`) follow the
same order with what object stores offer. A file is written under its hidden partial key,
verified, then moved to its name (an object appears whole or not at all, and an upload a crash
interrupted never appears). A folder has no atomic rename there: it is written in place and
completed by a marker object, :data:`COMPLETE_MARKER`, written last, after verification;
readers (:func:`resolve`, :func:`is_complete`) take a remote folder only when its marker is
there, and pruning deletes the marker first.

The module is a little over 600 lines: the local and the remote order are kept side by side on
purpose, so that a change to one is seen against the other.
"""

from __future__ import annotations

import errno
import os
import pickle
import re
import secrets
import shutil
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from drivetrain._utilities import paths
from drivetrain._utilities.sizes import format_size
from drivetrain.plugins.io.safe_loading import DamagedCheckpointError, check_torch_file, read_dcp_metadata
from drivetrain.plugins.io.write_behind import write_behind

_TEMPORARY = re.compile(r"^\.(?P<name>.+)\.drivetrain-(?P<kind>partial|old|deleted)-(?P<token>[0-9a-f]{12})$")
#: The object that completes a remote checkpoint folder (written last; readers require it).
COMPLETE_MARKER = ".drivetrain-complete"

# Temporary paths this process is writing right now (the background thread of AsyncCheckpointIO
# may be writing one while the training thread tidies the same folder).
_in_flight: set[str] = set()
_in_flight_lock = threading.Lock()
# Tokens of writes that forked children of this process will make (drivetrain.plugins.io.forked):
# their temporary files are in flight too, though this process never opens them.
_reserved: set[str] = set()
# Set in such a child: its one write uses the reserved token, and it never tidies (the parent does).
_forked_token: str | None = None

StorageOptions = Mapping[str, Any] | None

try:  # advisory locks say which temporary files a live process is still writing (POSIX)
    import fcntl
except ImportError:  # pragma: no cover - Windows: no lock, tidy() as before
    fcntl = None  # type: ignore[assignment]


def _hold(path: Path) -> int | None:
    """Take an exclusive advisory lock on ``path`` for as long as the returned descriptor is open.

    The kernel releases it when the process ends however it ends, so a leftover that nobody holds
    is a crashed write; one that is held belongs to a live writer in another process.
    """
    if fcntl is None:
        return None
    fd = os.open(path, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


def _release(fd: int | None) -> None:
    if fd is not None:
        os.close(fd)


def _held_by_another_process(path: Path) -> bool:
    """Whether a live writer (in another process) holds ``path``'s lock; False if it cannot tell."""
    if fcntl is None or not path.is_file() or path.is_symlink():
        return False
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        os.close(fd)  # also drops the lock just taken
    return False


def local_path(path: str | os.PathLike[str]) -> Path:
    """``path`` as a local :class:`~pathlib.Path`, for operations that exist only on local disks.

    Raises:
        ValueError: ``path`` is remote (callers check :func:`~drivetrain._utilities.paths.is_remote`
            first; a remote path must never become a local folder named ``s3:``).
    """
    if paths.is_remote(path):
        raise ValueError(f"'{os.fspath(path)}' is a remote path; this operation needs a local one.")
    return Path(paths.normalize(path))


def new_token() -> str:
    if _forked_token is not None:
        return _forked_token
    return secrets.token_hex(6)


def reserve_token(token: str) -> None:
    """Mark the temporary files named with ``token`` as written by this process (a forked child of it)."""
    with _in_flight_lock:
        _reserved.add(token)


def release_token(token: str) -> None:
    with _in_flight_lock:
        _reserved.discard(token)


def enter_forked_writer(token: str) -> None:
    """In a child forked to write one checkpoint: name its temporary file with ``token``; never tidy."""
    global _forked_token, _in_flight_lock
    _in_flight_lock = threading.Lock()  # another thread of the parent may have held it at the fork
    _forked_token = token


def partial_path(path: str | os.PathLike[str], token: str) -> Any:
    """The hidden name a write of ``path`` goes to (a :class:`Path` for a local ``Path``, else a string)."""
    if isinstance(path, Path):
        return path.with_name(f".{path.name}.drivetrain-partial-{token}")
    return paths.join(paths.parent(path), f".{paths.name(path)}.drivetrain-partial-{token}")


def _old_path(path: Path, token: str) -> Path:
    return path.with_name(f".{path.name}.drivetrain-old-{token}")


def is_temporary(name: str) -> bool:
    """Whether ``name`` is one of this module's hidden temporary names."""
    return _TEMPORARY.match(name) is not None


@contextmanager
def in_flight(path: Any) -> Iterator[Any]:
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


def write_file(
    path: str | os.PathLike[str],
    write: Callable[[IO[bytes]], object],
    *,
    verify: Callable[[Any], None] | None = None,
    storage_options: StorageOptions = None,
) -> None:
    """Write a file crash-safely: ``write(file)`` into a temporary file, flush, ``verify`` it, publish it as ``path``.

    ``verify(temporary)`` gets the temporary file's path and raises if it is not complete. On any
    error the temporary file is removed and whatever was at ``path`` stays. Local or remote.
    """
    if paths.is_remote(path):
        _write_remote_file(os.fspath(path), write, verify, storage_options)
        return
    if storage_options is not None:
        raise TypeError(
            f"storage_options={storage_options!r} were given for the local path '{os.fspath(path)}'; they "
            f"configure remote filesystems (s3://, gs:// ...). Leave them out for local paths."
        )
    target = local_path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    # A unique hidden name in the target's directory: os.replace is atomic only within one file
    # system, and concurrent writers (two ranks, two runs) must not share a temp file. Opened
    # with "xb" rather than mkstemp so the file gets the usual umask permissions, not 0600.
    with in_flight(partial_path(target, new_token())) as tmp:
        lock = None
        try:
            with open(tmp, "xb") as file:
                # Held until the file is published or removed: another process tidying this
                # folder (a second job, a program saving per-rank files) leaves it alone.
                lock = _hold(tmp)
                # The disk starts on the first chunks while the rest is produced: the fsync,
                # which stays the only thing that says the bytes are on disk, then waits for little.
                write(write_behind(file))
                file.flush()
                os.fsync(file.fileno())
            if verify is not None:
                verify(tmp)
            publish_file(tmp, target)
        except BaseException as error:
            tmp.unlink(missing_ok=True)
            _release(lock)  # the space of the removed file is freed once nothing holds it open
            lock = None
            full = _disk_full(target, write, error) if isinstance(error, Exception) else None
            if full is not None:
                raise full from error
            raise
        finally:
            _release(lock)


class _Counter:
    """A file that keeps nothing and counts the bytes written to it."""

    def __init__(self) -> None:
        self.written = 0

    def write(self, data: Any) -> int:
        size = len(memoryview(data).cast("B"))
        self.written += size
        return size

    def flush(self) -> None:
        pass


def _disk_full(target: Path, write: Callable[[IO[bytes]], object], error: Exception) -> OSError | None:
    """The error to raise instead of ``error`` when a write failed because the disk is full (else ``None``).

    torch's archive writer reports a full disk as ``unexpected pos``; either way the user needs to
    hear that the disk is full and how much the file needs, which a second, discarded
    serialisation measures (only on this failure path).
    """
    codes = {getattr(e, "errno", None) for e in _chain(error)}
    if not codes & {errno.ENOSPC, errno.EDQUOT} and "unexpected pos" not in str(error):
        return None
    try:
        free = shutil.disk_usage(target.parent).free
        counter = _Counter()
        write(counter)  # type: ignore[arg-type]
    except Exception:
        return None
    needed = counter.written
    if errno.EDQUOT in codes:
        why = f"Disk quota exceeded writing the checkpoint '{target}'"
    elif errno.ENOSPC in codes or needed > free:
        why = f"No space left on device writing the checkpoint '{target}'"
    else:
        return None
    return OSError(
        errno.EDQUOT if errno.EDQUOT in codes else errno.ENOSPC,
        f"{why}: it needs {format_size(needed)} and '{target.parent}' has {format_size(free)} free. The "
        f"previous checkpoint under that name, if any, is untouched. Free some space (older checkpoints: "
        f"ModelCheckpoint(save_top_k=...), ProjectConfiguration(total_limit=...)) or save to another disk.",
    )


def _chain(error: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def _write_remote_file(
    path: str,
    write: Callable[[IO[bytes]], object],
    verify: Callable[[Any], None] | None,
    options: StorageOptions,
) -> None:
    with paths.reaching(path):
        _write_remote_file_reached(path, write, verify, options)


def _write_remote_file_reached(
    path: str,
    write: Callable[[IO[bytes]], object],
    verify: Callable[[Any], None] | None,
    options: StorageOptions,
) -> None:
    fs, inner = paths.filesystem(path, options)
    with in_flight(partial_path(path, new_token())) as tmp:
        _, tmp_inner = paths.filesystem(tmp, options)
        try:
            paths.makedirs(paths.parent(path), options)
            with fs.open(tmp_inner, "wb") as file:
                write(file)
            if verify is not None:
                verify(tmp)
            # An object store moves by copying on the server, then deleting the source: the object
            # under ``path`` appears whole. A crash between the two leaves a partial key for tidy().
            fs.mv(tmp_inner, inner)
        except BaseException:
            _remove_quietly(fs, tmp_inner)
            raise


def _remove_quietly(fs: Any, inner: str) -> None:
    try:
        fs.rm(inner, recursive=True)
    except (FileNotFoundError, OSError):
        pass


def publish_folder(staging: Path, path: Path, token: str) -> None:
    """Make the complete local folder ``staging`` the checkpoint ``path``, then remove the one it replaces.

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


def complete_remote_folder(path: str, storage_options: StorageOptions = None) -> None:
    """Publish the remote folder ``path`` (written and verified): write its completion marker, last."""
    fs, inner = paths.filesystem(path, storage_options)
    fs.pipe_file(f"{inner.rstrip('/')}/{COMPLETE_MARKER}", b"")


def publish_link(target: str | os.PathLike[str], path: str | os.PathLike[str]) -> bool:
    """Make ``path`` a symbolic link to the published checkpoint ``target`` (a relative link), crash-safely.

    The link is made under a temporary name and renamed over ``path`` in one step, so a reader finds
    the checkpoint ``path`` named before or the new link, never nothing. A folder checkpoint at
    ``path`` is replaced (it is moved aside first). Returns ``False`` where the file system cannot
    hold links (the caller then writes a copy); local paths only.
    """
    target, path = local_path(target), local_path(path)
    token = new_token()
    with in_flight(partial_path(path, token)) as temporary:
        try:
            os.symlink(os.path.relpath(target, path.parent), temporary)
        except (OSError, NotImplementedError):
            return False
        if path.is_dir() and not path.is_symlink():
            aside = _old_path(path, token)
            os.rename(path, aside)
            os.replace(temporary, path)
            shutil.rmtree(aside, ignore_errors=True)
        else:
            os.replace(temporary, path)
        fsync_directory(path.parent)
    return True


def remove(path: str | os.PathLike[str], storage_options: StorageOptions = None) -> None:
    """Delete a checkpoint file or folder, never leaving half of one under its name.

    A local folder is renamed aside first; a remote folder loses its completion marker first.
    """
    if paths.is_remote(path):
        fs, inner = paths.fresh_filesystem(path, storage_options)
        if fs.isdir(inner):
            _remove_quietly(fs, f"{inner.rstrip('/')}/{COMPLETE_MARKER}")
        _remove_quietly(fs, inner)
        return
    path = local_path(path)
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
def resolve(path: str | os.PathLike[str], storage_options: StorageOptions = None) -> Any:
    """Where the checkpoint published as ``path`` is, even if a crash interrupted its replacement.

    ``path`` itself when it exists (a remote folder only with its completion marker). Otherwise,
    if a local folder publish stopped between its two renames, the new folder (complete: it was
    verified before the old one was moved) or, failing that, the old one. ``None`` when there is
    nothing. Changes nothing (readers on every rank call it). A local path comes back as a
    :class:`~pathlib.Path`, a remote one as the URL string.
    """
    if paths.is_remote(path):
        text = os.fspath(path)
        if paths.isfile(text, storage_options):
            return text
        if paths.isfile(paths.join(text, COMPLETE_MARKER), storage_options):
            return text
        return None
    path = local_path(path)
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


def published_at(path: str | os.PathLike[str], storage_options: StorageOptions = None) -> float:
    """When the checkpoint at ``path`` was published, as a POSIX timestamp (``-inf`` when it was not).

    A remote folder has no time of its own (object stores keep objects, not folders): it is its
    completion marker's, the object written last. Anything else: its modification time.
    """
    try:
        if paths.is_remote(path):
            fs, inner = paths.fresh_filesystem(path, storage_options)
            if fs.isdir(inner):
                return paths.modified(f"{os.fspath(path).rstrip('/')}/{COMPLETE_MARKER}", storage_options)
        return paths.modified(path, storage_options)
    except (OSError, NotImplementedError):  # removed meanwhile, or a store that keeps no times
        return float("-inf")


def tidy(directory: str | os.PathLike[str], storage_options: StorageOptions = None) -> None:
    """Finish interrupted folder publishes in ``directory`` and delete what crashed writes left there.

    Called before each save into ``directory`` (by one process). Temporary files this process is
    writing are kept.
    """
    if _forked_token is not None:
        return  # a forked writer: its parent tidied before letting it write
    if paths.is_remote(directory):
        _tidy_remote(os.fspath(directory), storage_options)
        return
    directory = local_path(directory)
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
        reserved = set(_reserved)
    for name, match in leftovers:
        leftover = directory / name
        if (
            match["token"] in reserved
            or os.fspath(leftover) in keep
            or not (leftover.exists() or leftover.is_symlink())
            or _held_by_another_process(leftover)
        ):
            continue
        if leftover.is_dir() and not leftover.is_symlink():
            shutil.rmtree(leftover, ignore_errors=True)
        else:
            leftover.unlink(missing_ok=True)


def being_written(folder: str | os.PathLike[str]) -> bool:
    """Whether a live writer (this process's or another's) has a temporary file open in the local ``folder``.

    An incomplete checkpoint folder that is being written is not a crash's leftover: pruning it
    would pull the folder from under its writer (two runs saving into one project folder).
    """
    if paths.is_remote(folder):
        return False
    folder = local_path(folder)
    try:
        names = os.listdir(folder)
    except OSError:
        return False
    with _in_flight_lock:
        ours = set(_in_flight)
        reserved = set(_reserved)
    for name in names:
        match = _TEMPORARY.match(name)
        if match is None or match["kind"] != "partial":
            continue
        path = folder / name
        if os.fspath(path) in ours or match["token"] in reserved or _held_by_another_process(path):
            return True
    return False


#: How long a remote temporary object (or folder) must have been left unchanged before a tidy treats it
#: as a crash's leftover. Object stores have no locks: a younger one may be another process's write in
#: progress (a second job, a rank's shards), which the local path tells by its lock.
REMOTE_LEFTOVER_AGE = 3600.0
_now = time.time


def _tidy_remote(directory: str, options: StorageOptions) -> None:
    with _in_flight_lock:
        keep = set(_in_flight)
    for name in paths.listdir(directory, options):
        if _TEMPORARY.match(name) is None:
            continue
        leftover = paths.join(directory, name)
        if leftover not in keep and _now() - _last_written(leftover, options) > REMOTE_LEFTOVER_AGE:
            paths.remove_tree(leftover, options)


def _last_written(path: str, options: StorageOptions) -> float:
    """When anything under the remote ``path`` (an object, or a folder of them) was last written; now if unknown."""
    fs, inner = paths.fresh_filesystem(path, options)
    try:
        found = fs.find(inner, detail=True, withdirs=False) if fs.isdir(inner) else {inner: fs.info(inner)}
        times = [paths.modified(f"{path.split('://', 1)[0]}://{key}", options) for key in found]
    except (OSError, NotImplementedError):
        return _now()  # unknown: never taken for a leftover
    return max(times, default=_now())


def is_complete(path: str | os.PathLike[str], storage_options: StorageOptions = None) -> bool:
    """Whether the checkpoint at ``path`` (a file or a sharded folder) is whole, judged from its structure.

    A file must be a complete ``torch.save`` archive; a folder must hold at least one file, every
    ``.pt`` file in it must be complete, and a DCP ``.metadata`` must read (safely) and match its
    data files; a remote folder must also carry its completion marker. Cheap: reads archive
    indexes and metadata, not tensor data.
    """

    if paths.is_remote(path):
        return _is_complete_remote(os.fspath(path), storage_options)
    path = local_path(path)
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


def _is_complete_remote(path: str, options: StorageOptions) -> bool:

    try:
        if paths.isfile(path, options):
            check_torch_file(path, options)
            return True
        names = paths.listdir(path, options)
        if COMPLETE_MARKER not in names:
            return False
        for name in names:
            if name.endswith(".pt"):
                check_torch_file(paths.join(path, name), options)
        if ".metadata" in names:
            read_dcp_metadata(path)
        return True
    except (DamagedCheckpointError, OSError, pickle.UnpicklingError):
        return False
