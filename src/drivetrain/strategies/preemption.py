"""Preemption: on a stop signal every rank stops at the same step boundary, saves, and exits.

A scheduler that takes the machines back (SLURM before a time limit or preemption, Kubernetes
evicting a pod, a spot instance being reclaimed) signals first, often one process only. The
handler installed here only notes the signal; the ranks then agree on a step to stop at, without
a collective per step:

* each rank's watcher thread looks for a request in the job's rendezvous store (one look-up
  every :data:`TICK_SECONDS`); a rank that received the signal itself puts the request there;
* a rank that sees the request marks itself *pending* and posts its *position*: the number of
  step boundaries it has passed;
* the stop step is one past the largest position posted. A pending rank never passes a boundary
  beyond its own post before the stop step is known, so every rank can reach it and none has
  passed it; the wait is at most a few ticks, once.

Until a signal arrives the training loop reads one attribute per step (``watch.pending``); the
watcher thread costs a store look-up five times a second, off the step path. A one-process job
stops at the next boundary. The front doors decide what stopping means (the Trainer saves a
checkpoint through the core checkpoint module and raises :class:`Preempted`).
"""

from __future__ import annotations

import os
import select
import signal
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

#: Seconds between the watcher thread's looks at the rendezvous store.
TICK_SECONDS = 0.2
#: Seconds a rank waits for the others to post their positions before giving up.
AGREE_TIMEOUT_SECONDS = 60.0


class Preempted(SystemExit):
    """Raised on every rank once the run stopped for a signal and its checkpoint is saved.

    It is a ``SystemExit``: the program ends (nothing after ``fit`` runs) with exit code
    ``128 + signal`` (143 for ``SIGTERM``, 138 for ``SIGUSR1``), what a shell reports for a process
    a signal ended, so schedulers and launchers see an unfinished run and may restart it.

    Attributes:
        signum: the signal that asked the run to stop.
        checkpoint: where the checkpoint to resume from was saved (``None`` when nothing was saved).
    """

    def __init__(self, signum: int, checkpoint: str | None = None) -> None:
        super().__init__(exit_code(signum))
        self.signum = signum
        self.checkpoint = checkpoint

    def __str__(self) -> str:
        saved = f"; checkpoint saved to {self.checkpoint}" if self.checkpoint else ""
        return f"stopped by {signal_name(self.signum)}{saved}"

    def __reduce__(self) -> tuple[Any, ...]:
        return (Preempted, (self.signum, self.checkpoint))


def exit_code(signum: int) -> int:
    """The exit code of a process preempted by ``signum``: ``128 + signum``."""
    return 128 + int(signum)


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


class PreemptionWatch:
    """The stop-signal handlers and the agreement on a stop step of one run (one ``fit``, one loop).

    Args:
        signals: the signals that stop the run.
        position: how many step boundaries this rank has passed (read by the watcher thread too).
        store: the job's rendezvous store (``None`` for one process).
        prefix: a key prefix unique to this run and shared by its ranks.
        rank: this process's global rank.
        world_size: the number of ranks.
    """

    def __init__(
        self,
        signals: Iterable[int],
        position: Callable[[], int],
        store: Any = None,
        prefix: str = "",
        rank: int = 0,
        world_size: int = 1,
    ) -> None:
        self.signals = tuple(dict.fromkeys(int(s) for s in signals))
        self._position = position
        self._store: Any = store if world_size > 1 else None
        self._prefix = prefix
        self.rank = rank
        self.world_size = world_size
        #: True once a stop was requested (on any rank): the loop then asks :meth:`stop_here`.
        self.pending = False
        #: True from the agreed boundary on: this rank is stopping (launchers read it).
        self.stopping = False
        #: The signal that asked to stop.
        self.signum: int | None = None
        self._received: int | None = None  # a signal this process received itself
        self._posted: int | None = None
        self._stop_at: int | None = None
        self._previous: dict[int, Any] = {}
        self._closed = threading.Event()
        # The watcher thread sleeps on a pipe the signal handler writes to. The handler runs on the
        # main thread between any two bytecodes, also inside a lock the main thread holds (an
        # Event's, in the middle of set()): it must take no lock at all, and a pipe write takes none.
        self._wake_fds: tuple[int, int] | None = None
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    # -- handlers --------------------------------------------------------------------------
    @property
    def can_agree(self) -> bool:
        """Whether the ranks can agree on a stop step: one process, or a rendezvous store to agree through."""
        return self.world_size == 1 or self._store is not None

    def install(self) -> bool:
        """Install the handlers; ``False`` (nothing installed) outside the main thread, or where the
        ranks could not agree (several processes without a rendezvous store: one rank stopping
        alone would leave the others waiting in its collectives)."""
        if (
            threading.current_thread() is not threading.main_thread()
            or not self.signals
            or not self.can_agree
        ):
            return False
        for signum in self.signals:
            self._previous[signum] = signal.signal(signum, self._handle)
        if self._store is not None:
            read_fd, write_fd = os.pipe()
            os.set_blocking(read_fd, False)
            os.set_blocking(write_fd, False)
            self._wake_fds = (read_fd, write_fd)
            self._thread = threading.Thread(target=self._watch, daemon=True, name="drivetrain-preemption")
            self._thread.start()
        return True

    def uninstall(self) -> None:
        """Restore the previous handlers; a signal received but never acted on is delivered to them."""
        self._closed.set()
        self._poke()
        if self._thread is not None and self._thread is not threading.current_thread():
            # Joined, not left running: a daemon thread inside a store call at interpreter exit
            # can abort the process. It wakes at once; a store call in flight takes milliseconds.
            self._thread.join(timeout=10.0)
        for signum, previous in self._previous.items():
            signal.signal(signum, previous if previous is not None else signal.SIG_DFL)
        self._previous.clear()
        fds, self._wake_fds = self._wake_fds, None  # after the handlers: none of ours can run now
        if fds is not None and (self._thread is None or not self._thread.is_alive()):
            for fd in fds:
                os.close(fd)
        received = self._received
        if received is not None and not self.stopping:
            self._received = None
            signal.raise_signal(received)  # the run ended before it could stop: not swallowed

    def _handle(self, signum: int, frame: Any) -> None:
        if self._received is None:
            self._received = signum
        if self._store is None:
            self.signum = self.signum or signum
        # Pending at once, not when the watcher thread runs: under load the thread may not run
        # before the loop's last steps, and the run would end unstopped. The loop then waits at
        # its next boundary for the thread's post (see stop_here).
        self.pending = True
        self._poke()
        previous = self._previous.get(signum)
        if callable(previous):
            previous(signum, frame)

    def _poke(self) -> None:
        """Wake the watcher thread (safe in a signal handler: one write, no lock)."""
        fds = self._wake_fds
        if fds is not None:
            try:
                os.write(fds[1], b"\0")
            except OSError:  # the pipe is full (a wake is pending anyway)
                pass

    def _sleep(self) -> None:
        """Sleep until poked, or for :data:`TICK_SECONDS`."""
        fds = self._wake_fds
        if fds is None:
            return
        select.select([fds[0]], [], [], TICK_SECONDS)
        try:
            os.read(fds[0], 4096)
        except OSError:  # nothing to read (the tick ran out)
            pass

    # -- agreeing on the stop step -----------------------------------------------------------
    def stop_here(self) -> bool:
        """Whether this boundary is the agreed stop step (asked at each boundary once :attr:`pending`).

        Blocks while the stop step is not known yet and this rank is past its posted position.
        """
        if self._store is None:
            self.stopping = True
            return True
        position = self._position()
        deadline = time.monotonic() + AGREE_TIMEOUT_SECONDS
        while self._stop_at is None:
            if self._error is not None:
                raise RuntimeError(
                    f"Agreeing on a preemption stop step failed: {self._error}"
                ) from self._error
            posted = self._posted
            if posted is not None and position <= posted:
                return False
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"Rank {self.rank} was asked to stop for preemption, but not every rank posted its step within "
                    f"{AGREE_TIMEOUT_SECONDS:.0f} s (a rank may have died or left the training loop)."
                )
            time.sleep(0.005)
        if position >= self._stop_at:
            self.stopping = True
            return True
        return False

    def _key(self, name: str) -> str:
        return f"drivetrain/{self._prefix}/preemption/{name}"

    def _watch(self) -> None:
        store = self._store
        requested = self._key("requested")
        try:
            while not self._closed.is_set():
                self._sleep()
                if self._closed.is_set():
                    return
                if self._received is not None:
                    store.compare_set(requested, "", str(self._received))
                elif not store.check([requested]):
                    continue
                self.signum = int(store.get(requested))
                self.pending = True  # before reading the position: the post must not lag the loop
                self._posted = self._position()
                store.set(self._key(f"position/{self.rank}"), str(self._posted))
                store.add(self._key("posted"), 1)
                while store.add(self._key("posted"), 0) < self.world_size:
                    if self._closed.wait(0.01):
                        return
                keys = [self._key(f"position/{rank}") for rank in range(self.world_size)]
                self._stop_at = max(int(value) for value in store.multi_get(keys)) + 1
                return
        except Exception as error:  # the store is gone: the job is ending
            self._error = error
