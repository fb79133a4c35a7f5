"""Checkpoint snapshots by ``fork``: the kernel's copy-on-write keeps the state as it was at the save.

At a background save the process forks. The child sees the checkpoint exactly as it was at that
moment (the kernel copies a page only when the parent writes to it), waits for its turn, writes
the file through the usual durable path (temporary file, write-back, fsync, verification, atomic
rename, directory fsync) and leaves with ``os._exit``. The parent returns as soon as the fork
did: the loop's stall is the copy of the page tables, not of the tensors.

Used only where that is safe (:func:`why_not`): Linux, a local path, every tensor a plain CPU
tensor (a forked child must not touch CUDA), the :class:`TorchCheckpointIO` family, and a save
called from the main thread (the child is killed when the thread that forked it ends, so that a
killed rank never leaves a writer behind).

The child does nothing but the write: no logging, no output, no collectives, no garbage
collection, no ``atexit``. Its result (a warning list, or the exception) comes back through a pipe
and its exit status; a signal that killed it is reported as such, and the previous checkpoint stays.
"""

from __future__ import annotations

import fcntl
import gc
import logging
import os
import pickle
import signal
import sys
import threading
import traceback
import warnings
from typing import Any

import torch
from torch import Tensor

from drivetrain._utilities import paths
from drivetrain._utilities.apply import apply_to_collection
from drivetrain.plugins.io import atomic

# Linux prctl(2) option: the signal the child gets when the thread that forked it ends.
_PR_SET_PDEATHSIG = 1
# The child's report must fit the pipe, which the parent reads only once the child has exited.
_REPORT_LIMIT = 60_000


def platform_supports_fork() -> bool:
    return sys.platform.startswith("linux") and hasattr(os, "fork") and hasattr(os, "register_at_fork")


def why_not(checkpoint: Any, path: str | os.PathLike[str]) -> str | None:
    """Why a forked snapshot of ``checkpoint`` for ``path`` would not be safe, or ``None`` when it is."""
    if not platform_supports_fork():
        return f"it needs Linux (os.fork and os.register_at_fork); this is {sys.platform}"
    if paths.is_remote(path):
        return f"'{os.fspath(path)}' is remote: remote filesystems run event-loop threads that do not survive a fork"
    if threading.current_thread() is not threading.main_thread():
        return (
            "the save was called from a thread other than the main thread; the writing process is tied to the "
            "thread that forks it, so that it dies with it"
        )
    found: list[str] = []

    def check(tensor: Tensor) -> Tensor:
        if not found and (type(tensor) not in (Tensor, torch.nn.Parameter) or tensor.device.type != "cpu"):
            found.append(f"{type(tensor).__name__} on {tensor.device}")
        return tensor

    apply_to_collection(checkpoint, Tensor, check)
    if found:
        return (
            f"the checkpoint holds a tensor that is not a plain CPU tensor ({found[0]}); a forked process must "
            f"not touch accelerator memory or distributed tensors"
        )
    return None


class ForkedWrite:
    """One forked child holding a snapshot of a checkpoint, and its write once :meth:`run` lets it start."""

    def __init__(self, save: Any, checkpoint: Any, path: str | os.PathLike[str]) -> None:
        # Everything the child needs is resolved before the fork (no imports or lookups after it).
        prctl = _prctl()
        self.path = path
        self.token = atomic.new_token()
        go_read, self._go = os.pipe2(os.O_CLOEXEC)
        self._report, report_write = os.pipe2(os.O_CLOEXEC)
        parent = os.getpid()
        atomic.reserve_token(self.token)
        try:
            with warnings.catch_warnings():
                # Python >= 3.12 warns on a fork while threads run; the child runs no Python code of theirs.
                warnings.filterwarnings(
                    "ignore", message=".*use of fork\\(\\) may lead to deadlocks", category=DeprecationWarning
                )
                pid = os.fork()
        except BaseException:
            atomic.release_token(self.token)
            for fd in (go_read, self._go, self._report, report_write):
                os.close(fd)
            raise
        if pid == 0:  # the child: never returns
            _child(prctl, parent, go_read, report_write, save, checkpoint, path, self.token)
        self.pid = pid
        os.close(go_read)
        os.close(report_write)

    def run(self) -> None:
        """Let the child write (after the writes requested before it), wait for it, raise its failure."""
        try:
            atomic.tidy(atomic.local_path(self.path).parent)  # here, where every write in flight is known
            try:
                os.write(self._go, b"g")
            except BrokenPipeError:
                pass  # the child is gone already; its exit status says why
            status = _wait(self.pid)
            self.pid = 0
            report = pickle.loads(_read_all(self._report) or pickle.dumps(None))
        finally:
            self.cancel()
        # The child reports a list (the warnings of a save that completed) or the exception that failed it.
        if isinstance(report, list):
            for message, category in report:
                warnings.warn(message, category, stacklevel=2)
            return
        atomic.partial_path(atomic.local_path(self.path), self.token).unlink(missing_ok=True)
        if isinstance(report, BaseException):
            raise report
        if status is not None and os.WIFSIGNALED(status):
            name = signal.Signals(os.WTERMSIG(status)).name
            raise RuntimeError(
                f"The process writing the checkpoint '{os.fspath(self.path)}' was killed by {name}; the "
                f"checkpoint was not written (any previous file under that name is untouched)."
            )
        raise RuntimeError(
            f"The process writing the checkpoint '{os.fspath(self.path)}' ended (status {status}) without a "
            f"report; the checkpoint was not written (any previous file under that name is untouched)."
        )

    def cancel(self) -> None:
        """Kill the child if it has not finished (a save abandoned), reap it, free the pipes and the token."""
        if self.pid:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            _wait(self.pid)
            self.pid = 0
        for fd in (self._go, self._report):
            if fd >= 0:
                os.close(fd)
        self._go = self._report = -1
        atomic.release_token(self.token)


def _wait(pid: int) -> int | None:
    """The exit status of the child ``pid``; ``None`` if something else reaped it (a SIGCHLD handler)."""
    while True:
        try:
            return os.waitpid(pid, 0)[1]
        except ChildProcessError:
            return None
        except InterruptedError:
            continue


def _read_all(fd: int) -> bytes:
    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_NONBLOCK)
    chunks = []
    while True:
        try:
            chunk = os.read(fd, 1 << 16)
        except BlockingIOError:
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks)


def _prctl() -> Any:
    import ctypes

    return ctypes.CDLL(None, use_errno=True).prctl


def _child(
    prctl: Any, parent: int, go: int, report: int, save: Any, checkpoint: Any, path: Any, token: str
) -> None:
    code = 1
    try:
        # Die with the parent (a kill -9 of the rank must not leave a writer), then make sure it still
        # lives: it may have died between the fork and the prctl.
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:
            os._exit(1)
        gc.disable()  # no finalisers of the parent's objects run here
        # The parent's handlers (preemption, requeue ...) must not run here: a SIGTERM sent to the
        # whole job leaves the write to finish; the parent's death still kills it (SIGKILL above).
        for number in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
            signal.signal(number, signal.SIG_IGN)
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
        logging.disable(logging.CRITICAL)
        torch.set_num_threads(1)  # the parent's thread pool did not survive the fork
        if os.read(go, 1) != b"g":
            os._exit(1)  # the parent gave up on this save
        atomic.enter_forked_writer(token)
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                save(checkpoint, path, None)
            # At most 20 warnings of 1000 characters each: the report must fit the pipe.
            payload = pickle.dumps([(str(w.message)[:1000], _picklable(w.category)) for w in caught[:20]])
            code = 0
        except BaseException as error:  # reported to the parent, raised there
            payload = _failure(error, path)
        _write_all(report, payload)
    except BaseException:
        pass
    finally:
        os._exit(code)


def _failure(error: BaseException, path: Any) -> bytes:
    text = "".join(traceback.format_exception(type(error), error, error.__traceback__))
    if hasattr(error, "add_note"):  # Python >= 3.11: the child's traceback travels with the error
        error.add_note(f"Traceback in the process that wrote the checkpoint:\n{text}")
    try:
        payload = pickle.dumps(error)
        if len(payload) <= _REPORT_LIMIT and isinstance(pickle.loads(payload), BaseException):
            return payload
    except Exception:
        pass
    summary = RuntimeError(
        f"The process writing the checkpoint '{os.fspath(path)}' failed with {type(error).__name__}: "
        f"{text[-(_REPORT_LIMIT // 2) :]}"
    )
    return pickle.dumps(summary)


def _picklable(category: type[Warning]) -> type[Warning]:
    try:
        pickle.loads(pickle.dumps(category))
    except Exception:
        return UserWarning
    return category


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
