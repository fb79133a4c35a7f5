"""A deterministic kill -9 at the N-th file-system event of a process, for kill-during-save tests.

:func:`install` wraps the calls a checkpoint save makes (each ``write`` on a file opened for
writing, ``fsync``, ``mkdir``, ``rename``/``replace``, ``unlink``/``rmdir``) in this process.
Once :func:`arm` is called, every such call is an event; at event ``kill_at`` the process sends
itself ``SIGKILL`` before the call happens (an ``open`` counts once the file exists, before
anything is written to it), so the files are left exactly as a crash there leaves them. ``torch.save`` to a path goes through a Python file object, so the chunks of one
checkpoint file are separate events. Nothing of this is in the library: the code under test is
unchanged.

Without ``kill_at`` the events are only counted (and recorded, with the path they touch), which
is how a test learns how many kill points a save has.

Processes forked after :func:`install` (a background save's writer, ``AsyncCheckpointIO(snapshot=
"fork")``) share the count and the record: an event in such a writer is counted in the one
sequence, and a kill there kills the process that armed the switch (the training process) first,
then the writer, as a kill of the training process would take its writer with it.

Many kill points per process start: :func:`install` with a ``sweep`` connection makes :func:`arm`
a fork point. The process (the *driver*) first copies the checkpoint folder as it is then; for
each kill point the other end of the connection sends, it puts the folder back as it was, forks a
child that continues the program from there with the kill switch set to that point, waits for it
and answers how it ended (``"killed"`` or its exit code). The driver never runs the rest of the
program itself; ``None`` ends it. The child is the killed process, with the program's whole
in-memory state as the uninterrupted run had it: no interpreter start, no training up to the save.
"""

from __future__ import annotations

import builtins
import fcntl
import io
import mmap
import os
import shutil
import signal
import struct
import tempfile
import threading
from typing import Any

import torch

_state: dict[str, Any] = {
    "armed": False,
    "kill_at": None,
    "root": "/",
    "sweep": None,
    "child": False,
    "lead": 0,  # the process that armed the switch
    "counter": None,  # shared memory: the number of events so far (forked writers count in it too)
    "record": -1,  # a file (shared with forked writers) of the events: one "kind\tpath" line each
}
_lock = threading.Lock()  # the training thread and a background save's thread both count


def _fresh_count() -> None:
    """A new count and record, shared with the processes this one forks from now on."""
    if _state["record"] >= 0:
        os.close(_state["record"])
    _state["counter"] = mmap.mmap(-1, 8)
    fd, name = tempfile.mkstemp(prefix="kill-points-")
    os.unlink(name)
    _state["record"] = fd


def _new_lock() -> None:
    global _lock
    _lock = threading.Lock()


os.register_at_fork(after_in_child=_new_lock)


def install(kill_at: int | None, root: str | os.PathLike[str] = "/", sweep: Any = None) -> None:
    """Wrap the file-system calls of this process (call once, in the process to be killed).

    Only calls on paths under ``root`` (the checkpoint folder) count, so that nothing else the
    process happens to write (a log line, a cache) moves the kill points. ``sweep``: a
    ``multiprocessing`` connection that makes :func:`arm` a fork point (see the module docstring).
    """
    _state.update(armed=False, kill_at=kill_at, root=os.path.abspath(root), sweep=sweep, child=False)
    _fresh_count()
    real_open = builtins.open

    def open_(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        handle = real_open(file, mode, *args, **kwargs)
        if any(flag in mode for flag in "wxa+"):
            _event("open", file)
            return _Writer(handle, _where(file))
        return handle

    builtins.open = open_  # type: ignore[assignment]
    io.open = open_  # type: ignore[assignment]  # pathlib opens through io.open
    for name in ("fsync", "mkdir", "rename", "replace", "unlink", "remove", "rmdir"):
        _wrap(os, name)
    real_rmtree = shutil.rmtree

    def rmtree(path: Any, *args: Any, **kwargs: Any) -> None:
        _event("rmtree", path)
        real_rmtree(path, *args, **kwargs)

    shutil.rmtree = rmtree  # type: ignore[assignment]
    real_save = torch.save

    def save(obj: Any, f: Any, *args: Any, **kwargs: Any) -> None:
        if isinstance(f, (str, os.PathLike)):
            with open_(f, "wb") as file:  # chunk by chunk through Python, not torch's C++ writer
                real_save(obj, file, *args, **kwargs)
            return
        real_save(obj, f, *args, **kwargs)

    torch.save = save  # type: ignore[assignment]


def arm() -> None:
    """Start counting events (the save under test comes next); in a sweep, fork a child per kill point."""
    if _state["sweep"] is not None:
        _drive(_state["sweep"])  # returns in each child only
    _state.update(armed=True, lead=os.getpid())


def swept() -> bool:
    """Whether this process is a sweep's child (it must end with ``os._exit``, reporting nothing)."""
    return bool(_state["child"])


def _drive(connection: Any) -> None:
    root = _state["root"]
    snapshot = root + ".at-arm"
    shutil.copytree(root, snapshot, symlinks=True)
    while True:
        kill_at = connection.recv()
        if kill_at is None:
            connection.close()
            os._exit(0)
        shutil.rmtree(root)  # the wrappers count nothing before arm(): this is not an event
        shutil.copytree(snapshot, root, symlinks=True)
        pid = os.fork()
        if pid == 0:
            _state.update(sweep=None, child=True, kill_at=kill_at)
            _fresh_count()
            return
        _, status = os.waitpid(pid, 0)
        killed = os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
        connection.send("killed" if killed else os.waitstatus_to_exitcode(status))


def events() -> list[tuple[str, str]]:
    """The events counted so far, by this process and the writers it forked: (kind, path)."""
    record = _state["record"]
    if record < 0:
        return []  # never installed in this process
    size = os.fstat(record).st_size
    lines = os.pread(record, size, 0).decode().splitlines()
    return [(kind, where) for kind, where in (line.split("\t", 1) for line in lines)]


def _event(kind: str, path: Any) -> None:
    if not _state["armed"]:
        return
    where = _where(path)
    if where is None or not (where == _state["root"] or where.startswith(_state["root"] + os.sep)):
        return
    record, counter = _state["record"], _state["counter"]
    with _lock:
        fcntl.lockf(record, fcntl.LOCK_EX)  # against a forked writer counting at the same time
        try:
            count = struct.unpack_from("q", counter)[0] + 1
            struct.pack_into("q", counter, 0, count)
            os.pwrite(record, f"{kind}\t{where}\n".encode(), os.fstat(record).st_size)
        finally:
            fcntl.lockf(record, fcntl.LOCK_UN)
    if count == _state["kill_at"]:
        if os.getpid() != _state["lead"]:
            os.kill(_state["lead"], signal.SIGKILL)  # a writer forked by the training process
        os.kill(os.getpid(), signal.SIGKILL)


def _where(path: Any) -> str | None:
    """The absolute path a call touches (a file descriptor is looked up in /proc)."""
    if isinstance(path, int):
        try:
            return os.readlink(f"/proc/self/fd/{path}")
        except OSError:
            return None
    if isinstance(path, (str, bytes, os.PathLike)):
        return os.path.abspath(os.fsdecode(path))
    return None


def _wrap(module: Any, name: str) -> None:
    real = getattr(module, name)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        _event(name, args[0] if args else "")
        return real(*args, **kwargs)

    setattr(module, name, wrapper)


class _Writer:
    """A file opened for writing whose every ``write`` is an event."""

    def __init__(self, handle: Any, name: Any) -> None:
        self._handle = handle
        self._name = name

    def write(self, data: Any) -> int:
        _event("write", self._name)
        return self._handle.write(data)

    def __enter__(self) -> _Writer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self._handle.close()

    def __iter__(self) -> Any:
        return iter(self._handle)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._handle, name)
