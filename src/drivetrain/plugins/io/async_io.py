"""Checkpoint saves in a background thread, so training continues while the file is written.

The checkpoint is snapshotted before ``save_checkpoint`` returns, so the caller may change
parameters and optimizer state straight away; only the write (serialisation and disk I/O)
happens later, in the order the saves were requested. The snapshot is a copy of the tensors to
CPU memory kept from earlier saves (see :mod:`drivetrain.plugins.io.staging`), written by one
worker thread; or, when asked for and safe, a fork (the child process sees the state of the call
by copy-on-write and writes it, see :mod:`drivetrain.plugins.io.forked`). GPU tensors are copied
into pinned host memory on a side stream, ordered by events, so that neither the training thread
nor the GPU's compute waits for the copy's host side (see :mod:`drivetrain.plugins.io.device_staging`).
"""

from __future__ import annotations

import sys
import threading
import warnings
import weakref
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_for_futures
from pathlib import Path
from typing import Any

from drivetrain._utilities import paths
from drivetrain.plugins.io import forked
from drivetrain.plugins.io.checkpoint_io import CheckpointIO
from drivetrain.plugins.io.device_staging import DeviceLease, DeviceStagingPool
from drivetrain.plugins.io.staging import Lease, StagingPool, snapshot
from drivetrain.plugins.io.torch_io import TorchCheckpointIO, reject_storage_options

_SNAPSHOTS = ("copy", "auto", "fork")


class AsyncCheckpointIO(CheckpointIO):
    """Wrap another :class:`CheckpointIO` so that its saves run in the background.

    An error in a background save is raised by the next call of any method (or by
    :meth:`teardown`). If the object is dropped without :meth:`teardown`, the error is reported
    as a ``RuntimeWarning`` when it is garbage-collected or the interpreter exits.
    :meth:`load_checkpoint` and :meth:`remove_checkpoint` first wait for pending saves, so they
    see every save requested before them.

    Saves through a :class:`TorchCheckpointIO` (the default, or a subclass: it must not keep the
    checkpoint's tensors once its ``save_checkpoint`` returns) copy the tensors into CPU memory
    kept from the previous save, which is several times faster than copying into new memory; the
    memory is released by :meth:`teardown`. Any other ``CheckpointIO`` may keep what it is given,
    so it gets new copies every time. CUDA tensors go to pinned host memory kept from save to save,
    copied on a stream of their own: the save returns as soon as the copies are queued, and
    the GPU's later work waits (on the device) only for the copy itself, never for the disk.

    On Linux, ``snapshot="auto"`` or ``"fork"`` snapshots a save to a local path whose tensors are
    all on the CPU without copying: the process forks, and the child, which sees the state as it
    was at the call, writes the file and exits (see :mod:`drivetrain.plugins.io.forked`). The loop
    waits only for the fork, but the kernel then copies every page training writes while the
    child lives, one page fault each: the first optimizer step after a save pays more than the
    copy would have (26x a plain in-place update of the state here, ~2x the synchronous save), so
    the copy stays the default. A fork pays off when the state is barely written while the file
    is written (mostly frozen weights, steps longer than the write).

    Args:
        checkpoint_io: the IO that does the writing; :class:`TorchCheckpointIO` by default.
        snapshot: how the state is held for the background write. ``"copy"`` (default): by a
            copy into CPU memory. ``"auto"``: by a fork where that is safe (Linux, a local path, only plain CPU tensors, a
            :class:`TorchCheckpointIO`, the save called from the main thread), else by a copy.
            A subclass of ``TorchCheckpointIO`` with a ``save_checkpoint`` of its own gets a copy
            under ``"auto"``: in a forked child, what it records in this process would be lost.
            ``"fork"``: always by a fork; a save where it is not safe raises, saying why.
    """

    def __init__(self, checkpoint_io: CheckpointIO | None = None, snapshot: str = "copy") -> None:
        if checkpoint_io is not None and not isinstance(checkpoint_io, CheckpointIO):
            raise TypeError(
                f"AsyncCheckpointIO(checkpoint_io=...) expects a CheckpointIO instance, got "
                f"{type(checkpoint_io).__name__}."
            )
        if snapshot not in _SNAPSHOTS:
            raise ValueError(
                f"AsyncCheckpointIO(snapshot={snapshot!r}) is not a snapshot mode; choose one of "
                f"{', '.join(repr(mode) for mode in _SNAPSHOTS)} ('auto' forks where that is safe, else copies)."
            )
        self.checkpoint_io: CheckpointIO = checkpoint_io if checkpoint_io is not None else TorchCheckpointIO()
        if snapshot == "fork":
            if not forked.platform_supports_fork():
                raise ValueError(
                    f"AsyncCheckpointIO(snapshot='fork') needs Linux (os.fork and os.register_at_fork); this is "
                    f"{sys.platform}. Use snapshot='auto' or 'copy'."
                )
            if not isinstance(self.checkpoint_io, TorchCheckpointIO):
                raise ValueError(
                    f"AsyncCheckpointIO(snapshot='fork') writes through a TorchCheckpointIO (or a subclass); got "
                    f"{type(self.checkpoint_io).__name__}, which may not be safe to run in a forked process. "
                    f"Use snapshot='copy' (or 'auto', which copies for it)."
                )
        self.snapshot = snapshot
        self._queue = _SaveQueue()
        self._staging = StagingPool() if isinstance(self.checkpoint_io, TorchCheckpointIO) else None
        self._device_staging = DeviceStagingPool() if self._staging is not None else None
        # The finaliser holds the queue, never ``self``, so it cannot keep this object alive.
        weakref.finalize(self, self._queue.close_abandoned)

    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: str | Path, storage_options: Any | None = None
    ) -> None:
        """Snapshot ``checkpoint``'s tensors to CPU now and write it to ``path`` in the background."""
        self._raise_failed_saves()
        if isinstance(self.checkpoint_io, TorchCheckpointIO) and not paths.is_remote(path):
            # Fail here, not one call later from the worker thread.
            reject_storage_options(self.checkpoint_io, storage_options)
        if self.snapshot == "fork" or (self.snapshot == "auto" and _plain_torch_save(self.checkpoint_io)):
            reason = forked.why_not(checkpoint, path)
            if reason is None:
                try:
                    write = forked.ForkedWrite(self.checkpoint_io.save_checkpoint, checkpoint, path)
                except OSError:
                    if self.snapshot == "fork":
                        raise
                else:
                    self._queue.submit(path, _run_forked, write)
                    return
            elif self.snapshot == "fork":
                raise ValueError(
                    f"AsyncCheckpointIO(snapshot='fork') cannot save to '{path}' by a fork: {reason}. Use "
                    f"snapshot='auto' (forks where safe, else copies) or 'copy' (the default)."
                )
        if self._staging is None:
            self._queue.submit(
                path, self.checkpoint_io.save_checkpoint, snapshot(checkpoint), path, storage_options
            )
            return
        save = self.checkpoint_io.save_checkpoint
        if self._device_staging is not None and self._device_staging.holds_device_tensors(checkpoint):
            staged, device_lease = self._device_staging.snapshot(checkpoint)
            self._queue.submit(
                path,
                _write_device_staged,
                save,
                self._device_staging,
                device_lease,
                staged,
                path,
                storage_options,
            )
            return
        staged, lease = self._staging.snapshot(checkpoint)
        self._queue.submit(path, _write_staged, save, self._staging, lease, staged, path, storage_options)

    def load_checkpoint(
        self, path: str | Path, map_location: Any | None = None, **kwargs: Any
    ) -> dict[str, Any]:
        """Wait for pending saves, then load through the wrapped IO (``kwargs`` go to it)."""
        self._queue.wait()
        self._raise_failed_saves()
        return self.checkpoint_io.load_checkpoint(path, map_location, **kwargs)

    def remove_checkpoint(self, path: str | Path) -> None:
        """Wait for pending saves (one may be writing ``path``), then remove through the wrapped IO."""
        self._queue.wait()
        self._raise_failed_saves()
        self.checkpoint_io.remove_checkpoint(path)

    def teardown(self) -> None:
        """Wait for every pending save and stop the worker thread; raise the first failed save."""
        self._queue.shut_down()
        if self._staging is not None:
            self._staging.clear()
        if self._device_staging is not None:
            self._device_staging.clear()
        try:
            self._raise_failed_saves()
        finally:
            self.checkpoint_io.teardown()

    def _raise_failed_saves(self) -> None:
        failures = self._queue.take_failures()
        if not failures:
            return
        path, error = failures[0]
        note = f"Raised by the background save of the checkpoint to '{path}' (AsyncCheckpointIO)."
        if len(failures) > 1:
            others = ", ".join(f"'{p}' ({type(e).__name__}: {e})" for p, e in failures[1:])
            note += f" Later background saves failed too: {others}."
        if hasattr(error, "add_note"):  # Python >= 3.11
            error.add_note(note)
        raise error

    # Strategies are pickled into spawned processes; threads and locks cannot travel.
    def __getstate__(self) -> dict[str, Any]:
        return {"checkpoint_io": self.checkpoint_io, "snapshot": self.snapshot}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["checkpoint_io"], state.get("snapshot", "copy"))  # type: ignore[misc]

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.checkpoint_io!r}, snapshot={self.snapshot!r})"


class _SaveQueue:
    """The worker thread, the pending saves and their failures; shared with the finaliser."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._executor: ThreadPoolExecutor | None = None
        self._pending: list[Future[None]] = []
        self._failures: list[tuple[str, BaseException]] = []
        self._worker: int | None = None

    def submit(self, path: str | Path, function: Any, *args: Any) -> None:
        with self._lock:
            if self._executor is None:
                # One worker: saves run one at a time, in the order they were requested.
                self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="drivetrain-ckpt")
            self._pending = [future for future in self._pending if not future.done()]
            self._pending.append(self._executor.submit(self._run, path, function, *args))

    def _run(self, path: str | Path, function: Any, *args: Any) -> None:
        self._worker = threading.get_ident()
        try:
            function(*args)
        except BaseException as error:
            with self._lock:
                self._failures.append((str(path), error))

    def wait(self) -> None:
        with self._lock:
            pending = list(self._pending)
        wait_for_futures(pending)

    def take_failures(self) -> list[tuple[str, BaseException]]:
        with self._lock:
            failures, self._failures = self._failures, []
        return failures

    def shut_down(self, wait: bool = True) -> None:
        with self._lock:
            executor, self._executor = self._executor, None
            self._pending = [] if wait else self._pending
        if executor is not None:
            executor.shutdown(wait=wait)

    def close_abandoned(self) -> None:
        """Finish the saves of an object dropped without ``teardown()`` and report their failures."""
        # The cyclic garbage collector may run this on the worker thread itself, which cannot wait
        # for its own queue; pending saves still complete there, but a later failure goes unseen.
        self.shut_down(wait=threading.get_ident() != self._worker)
        failures = self.take_failures()
        if failures:
            listed = "; ".join(f"'{path}' ({type(error).__name__}: {error})" for path, error in failures)
            warnings.warn(
                f"{len(failures)} background checkpoint save(s) failed and were never reported, because "
                f"AsyncCheckpointIO.teardown() was not called: {listed}",
                RuntimeWarning,
                stacklevel=2,
            )


def _plain_torch_save(io: CheckpointIO) -> bool:
    # A subclass with a save_checkpoint of its own may keep state in this process (a record of what
    # it wrote, an event it waits on); in a forked child that would be lost, so "auto" copies for it.
    return isinstance(io, TorchCheckpointIO) and type(io).save_checkpoint is TorchCheckpointIO.save_checkpoint


def _run_forked(write: forked.ForkedWrite) -> None:
    write.run()


def _write_staged(save: Any, staging: StagingPool, lease: Lease, *args: Any) -> None:
    # A function, not a method: a pending save must not keep the AsyncCheckpointIO alive.
    try:
        save(*args)
    finally:
        # Written (or failed and removed): the next snapshot may overwrite these buffers.
        staging.release(lease)


def _write_device_staged(save: Any, staging: DeviceStagingPool, lease: DeviceLease, *args: Any) -> None:
    try:
        lease.wait()  # the device copies into the pinned buffers have completed
        save(*args)
    finally:
        staging.release(lease)
