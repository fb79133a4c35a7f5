"""What this rank's collectives are doing: mismatch checks, and a watchdog that turns a stuck collective into an error.

Every collective of a parallel strategy is announced to the :class:`CollectiveMonitor` of its
process group. By default that only notes which collective runs and from where (well under a
microsecond, no communication); a watchdog thread looks at it twice a second. Nothing crosses
processes while collectives complete. When one has waited :data:`CHECK_AFTER_SECONDS`, or the
rank has been idle that long outside any collective, the rank publishes its state to the
rendezvous store, and a waiting rank reads the others':

* every rank waits in a drivetrain collective, but not all in the same one (``all_reduce`` on one
  rank, ``barrier`` on another): a deadlock. The job ends with a :class:`CollectiveMismatchError`
  naming each rank's collective and call site, a few seconds after the last rank arrived.
* the ranks that are not in the collective are idle (no CPU time for themselves or their
  data-loader workers, no storage I/O) and nobody is busy — typically a rank sits inside a
  collective drivetrain does not see, such as DDP's gradient all-reduce, because ``save_state``
  or ``barrier`` ran on some ranks only: after ``stall_timeout`` seconds (default
  :data:`STALL_TIMEOUT`) the job ends with a :class:`CollectiveStuckError` naming where each
  rank is. While any rank is busy the wait goes on (up to the process group's ``timeout``).

A rank blocked inside the backend cannot be interrupted, so the watchdog hands the error to
``on_stuck``, which records it and ends the process; the peers' broken connections end theirs,
and the launcher names this rank as the cause.

In debug mode every collective first exchanges its fingerprint (operation, shape and dtype of
each tensor, and call site) through the store, and every rank raises
:class:`CollectiveMismatchError` when they disagree, before the backend sees anything (gloo aborts the whole process on mismatched
sizes). A stuck wait there raises in the waiting rank itself, after ``stall_timeout`` (default
:data:`DEBUG_STALL_TIMEOUT` in debug mode).
"""

from __future__ import annotations

import datetime
import json
import os
import sys
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import Any, NamedTuple

from torch import Tensor

from drivetrain.strategies.collective_errors import CollectiveMismatchError, CollectiveStuckError

#: How often the watchdog looks at this rank's collective and activity.
TICK_SECONDS = 0.5
#: How long leaving the process group waits for the watchdog thread to finish its current tick.
STOP_JOIN_SECONDS = 5.0
#: A collective (or an idle rank) is reported to the other ranks after this long.
CHECK_AFTER_SECONDS = 2.0
#: Default ``stall_timeout``: how long a collective waits for idle ranks that are elsewhere.
STALL_TIMEOUT = 120.0
#: Default ``stall_timeout`` in debug mode.
DEBUG_STALL_TIMEOUT = 10.0

_monotonic = time.monotonic
_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_STRATEGIES = os.path.join(_PACKAGE, "strategies")
_STDLIB = os.path.dirname(os.__file__)


class InFlight(NamedTuple):
    """The collective a rank is in."""

    seq: int
    operation: str
    payload: Any
    frame: FrameType | None
    started: float


class CollectiveMonitor:
    """Per process group: the collective in flight, the debug checks, and the stuck-collective watchdog.

    Args:
        store: the job's rendezvous store (``None``: no cross-rank checks and no watchdog).
        namespace: a key prefix unique to this process group.
        rank: this process's global rank.
        world_size: the number of ranks.
        debug: exchange fingerprints through the store before every collective.
        stall_timeout: seconds a collective may wait for idle ranks elsewhere (``None``: no limit).
        debug_stall_timeout: the same while in debug mode.
        on_stuck: called from the watchdog thread with the error when a collective is stuck inside
            the backend; it is expected to end the process.
    """

    def __init__(
        self,
        store: Any,
        namespace: str,
        rank: int,
        world_size: int,
        *,
        debug: bool = False,
        stall_timeout: float | None = STALL_TIMEOUT,
        debug_stall_timeout: float | None = DEBUG_STALL_TIMEOUT,
        on_stuck: Callable[[BaseException], None] | None = None,
    ) -> None:
        self.store = store
        self.namespace = namespace
        self.rank = rank
        self.world_size = world_size
        self.debug = debug and store is not None and world_size > 1
        self.stall_timeout = stall_timeout
        self.debug_stall_timeout = debug_stall_timeout
        #: The collective this rank is in, while it runs: the fields of :class:`InFlight`, as a plain
        #: tuple (cheapest to make; the watchdog makes the named tuple).
        self.current: tuple[int, str, Any, FrameType | None, float] | None = None
        self._seq = 0
        self._on_stuck = on_stuck
        self._stop: threading.Event | None = None  # made by start(): an inert monitor stays picklable
        self._handed_over: BaseException | None = None  # raised by the main thread in a debug wait
        self._thread: threading.Thread | None = None

    # -- the collective path ---------------------------------------------------------------
    def enter(self, operation: str, payload: Any = None) -> None:
        """Note the collective about to run; clear :attr:`current` when it returns.

        ``payload`` is what the fingerprint describes: a tensor (shape and dtype), a list of
        them, or a plain value such as a reduce op or a source rank.
        """
        self._seq = seq = self._seq + 1
        self.current = (seq, operation, payload, sys._getframe(2), _monotonic())
        if self.debug:
            try:
                self._exchange_fingerprints(InFlight(*self.current))
            except BaseException:
                self.current = None
                raise

    # -- debug mode ------------------------------------------------------------------------
    def _key(self, *parts: object) -> str:
        return "/".join([f"drivetrain/{self.namespace}/collectives", *map(str, parts)])

    def _exchange_fingerprints(self, flight: InFlight) -> None:
        store = self.store
        store.set(self._key("fp", flight.seq, self.rank), json.dumps(fingerprint(flight)))
        keys = [self._key("fp", flight.seq, rank) for rank in range(self.world_size)]
        self._wait_for(keys)
        everyone = [json.loads(value) for value in store.multi_get(keys)]
        if flight.seq > 2:  # every rank read seq-2's keys before writing seq-1's, which we have read
            store.delete_key(self._key("fp", flight.seq - 2, self.rank))
        if all(_comparable(f) == _comparable(everyone[0]) for f in everyone):
            if all(f["site"] == everyone[0]["site"] for f in everyone):
                return
            # The same operation on tensors of one shape, from different places: typically a rank
            # skipped one call (an `if` on the rank) and pairs its next one with the others' skipped
            # one, which would mix unrelated values without any error until later.
            raise CollectiveMismatchError(
                f"Collective #{flight.seq} is called from different places on different ranks: "
                f"{_grouped([_describe(f) for f in everyone])} (checked before it reached the backend). The "
                f"values would be combined with those of another call: did a rank skip a collective? Every rank must "
                f"make the same collective calls in the same order (debug mode also compares where they are made)."
            )
        raise CollectiveMismatchError(
            f"Collective #{flight.seq} differs between ranks: {_grouped([_describe(f) for f in everyone])} (checked "
            f"before it reached the backend). Every rank must call the same collectives, in the same order, with "
            f"tensors of the same shape and dtype (pad them first with pad_across_processes, or gather Python "
            f"objects instead)."
        )

    def _wait_for(self, keys: list[str]) -> None:
        """Wait for ``keys`` in short slices, so the watchdog can hand this thread an error to raise."""
        piece = datetime.timedelta(seconds=TICK_SECONDS)
        while True:
            handed_over, self._handed_over = self._handed_over, None
            if handed_over is not None:
                raise handed_over
            try:
                self.store.wait(keys, piece)
                return
            except RuntimeError as error:  # torch's DistStoreError: a slice ran out
                if "timeout" not in str(error).lower():
                    raise

    # -- the watchdog ----------------------------------------------------------------------
    def start(self) -> None:
        """Start the watchdog thread (when the process group is up)."""
        if self.store is None or self.world_size < 2 or self._thread is not None:
            return
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._watch, daemon=True, name="drivetrain-collective-watchdog"
        )
        self._thread.start()

    def stop(self) -> None:
        """Stop the watchdog (when the process group is left) and wait for it to finish its tick.

        Joined, not only signalled: a daemon thread still inside a store call when the interpreter
        finalises is ended from within torch's C++ code, which aborts the process ("terminate called
        without an active exception") after all its work is done.
        """
        if self._stop is not None:
            self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=STOP_JOIN_SECONDS)

    def _watch(self) -> None:
        stop = self._stop
        assert stop is not None
        main = threading.main_thread().ident
        activity = _Activity()
        published = False
        suspect: tuple[int, str] | None = None  # a deadlock seen once; confirmed on the next tick
        try:
            self._publish({"state": "busy"})
        except Exception:
            return
        while not stop.wait(TICK_SECONDS):
            now = time.monotonic()
            idle_for = activity.idle_for(now)
            current = self.current
            flight = InFlight(*current) if current is not None else None
            waiting = flight is not None and now - flight.started >= CHECK_AFTER_SECONDS
            try:
                if waiting:
                    assert flight is not None
                    self._publish(_collective_state(flight))
                    published = True
                elif flight is None and idle_for >= CHECK_AFTER_SECONDS:
                    self._publish({"state": "idle", "seq": self._seq, "where": where_is(main)})
                    published = True
                elif published:
                    self._publish({"state": "busy"})
                    published = False
                verdict = self._judge(flight, now) if flight is not None and waiting else None
            except Exception:
                return  # the store is gone: the job is ending, and the launcher reports why
            if verdict is None:
                suspect = None
                continue
            assert flight is not None
            deadlock, message = verdict
            if deadlock:
                if suspect != (flight.seq, message):
                    suspect = (flight.seq, message)  # confirm on the next tick: states may be a tick old
                    continue
            elif (limit := self.debug_stall_timeout if self.debug else self.stall_timeout) is None or (
                now - flight.started < limit
            ):
                continue
            kind = CollectiveMismatchError if deadlock else CollectiveStuckError
            self._give_up(kind(f"Rank {self.rank}: {message}"))
            return

    def _publish(self, state: dict[str, Any]) -> None:
        self.store.set(self._key("state", self.rank), json.dumps(state))

    def _judge(self, flight: InFlight, now: float) -> tuple[bool, str] | None:
        """``(deadlock, message)`` when the other ranks will not join ``flight``; ``None`` while they may."""
        keys = [self._key("state", rank) for rank in range(self.world_size)]
        if not self.store.check(keys):
            return None  # some rank's watchdog has not started yet
        states = [json.loads(value) for value in self.store.multi_get(keys)]
        if any(state["state"] == "busy" for state in states):
            return None  # someone is working: the job may still be progressing
        summary = _grouped([_describe_state(state) for state in states])
        # Ranks past the collective this one waits in (they completed it, or it never reaches them).
        ahead = [
            rank
            for rank, state in enumerate(states)
            if state["seq"] > flight.seq or (state["state"] == "idle" and state["seq"] >= flight.seq)
        ]
        hint = (
            f" {_ranks(ahead).capitalize()} already completed collective #{flight.seq}, which rank {self.rank} still "
            f"waits in: the tensors there probably differed in size between ranks (debug_collectives=True checks "
            f"shapes before every collective)."
            if ahead
            else ""
        )
        if all(state["state"] == "collective" for state in states):
            if all(_comparable(state["fingerprint"]) == _comparable(fingerprint(flight)) for state in states):
                return None  # every rank is in this collective: it is running
            return True, (
                f"the ranks wait in different collectives, which can never complete: {summary}. Every rank must "
                f"call the same collectives in the same order.{hint}"
            )
        if ahead:
            return True, f"a collective can never complete: {summary}.{hint}"
        return False, (
            f"a collective waited {now - flight.started:.0f} s for ranks that are elsewhere and make no progress: "
            f"{summary}. A rank outside drivetrain's collectives is often inside one drivetrain does not see "
            f"(DDP's gradient all-reduce): was save_state, save_checkpoint or barrier called on some ranks only? "
            f"(The limit is the strategy's stall_timeout.)"
        )

    def _give_up(self, error: BaseException) -> None:
        if self.debug and self._main_thread_waits_on_store():
            self._handed_over = error  # the main thread raises it from _wait_for
        elif self._on_stuck is not None:
            self._on_stuck(error)

    def _main_thread_waits_on_store(self) -> bool:
        frame = sys._current_frames().get(threading.main_thread().ident or 0)
        while frame is not None:
            if frame.f_code is CollectiveMonitor._wait_for.__code__:
                return True
            frame = frame.f_back
        return False


# -- describing collectives and ranks ----------------------------------------------------------
def fingerprint(flight: InFlight) -> dict[str, str]:
    """What must agree across ranks (operation, tensors or parameters), and where it was called."""
    return {
        "operation": flight.operation,
        "what": describe_payload(flight.payload),
        "site": call_site(flight.frame),
    }


def _comparable(print_: dict[str, Any]) -> tuple[str, str]:
    return print_["operation"], print_["what"]


def _describe(print_: dict[str, Any]) -> str:
    return f"{print_['operation']}({print_['what']}) at {print_['site']}"


def _collective_state(flight: InFlight) -> dict[str, Any]:
    return {"state": "collective", "seq": flight.seq, "fingerprint": fingerprint(flight)}


def _describe_state(state: dict[str, Any]) -> str:
    if state["state"] == "collective":
        return f"waiting in collective #{state['seq']} {_describe(state['fingerprint'])}"
    return f"in no drivetrain collective (last: #{state['seq']}), idle, at {state['where']}"


def _grouped(descriptions: list[str]) -> str:
    """``rank 0: …; ranks 1-3: …`` (ranks that say the same are listed together)."""
    groups: dict[str, list[int]] = {}
    for rank, description in enumerate(descriptions):
        groups.setdefault(description, []).append(rank)
    return "; ".join(f"{_ranks(ranks)}: {description}" for description, ranks in groups.items())


def _ranks(ranks: list[int]) -> str:
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    if ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"ranks {ranks[0]}-{ranks[-1]}"
    return "ranks " + ", ".join(map(str, ranks))


def describe_payload(payload: Any) -> str:
    """``shape (3, 4), torch.float32`` for a tensor, each item for a list, ``str()`` of anything else."""
    if isinstance(payload, Tensor):
        return f"shape {tuple(payload.shape)}, {payload.dtype}"
    if payload is None:
        return ""
    if isinstance(payload, (list, tuple)):
        return "[" + ", ".join(describe_payload(item) for item in payload) + "]"
    return str(payload)


def call_site(frame: FrameType | None) -> str:
    """Where a collective was called: the nearest frame outside drivetrain, after the drivetrain frame
    (outside the strategies) that asked for it, if any: ``results.py:160 (log), called from train.py:40 (…)``."""
    inside = None
    while frame is not None:
        name = os.path.abspath(frame.f_code.co_filename)
        if not name.startswith(_PACKAGE):
            here = _frame(frame)
            return here if inside is None else f"{inside}, called from {here}"
        if inside is None and not name.startswith(_STRATEGIES):
            inside = _frame(frame)
        frame = frame.f_back
    return inside or "an unknown place"


def where_is(thread_id: int | None) -> str:
    """Where a thread is now: the nearest frame of user code, and the innermost frame below it."""
    frame = sys._current_frames().get(thread_id or 0)
    if frame is None:
        return "an unknown place"
    innermost = _frame(frame)
    walker: FrameType | None = frame
    while walker is not None:
        name = os.path.abspath(walker.f_code.co_filename)
        if not name.startswith((_PACKAGE, _STDLIB)) and "site-packages" not in name:
            user = _frame(walker)
            return user if user == innermost else f"{user}, inside {innermost}"
        walker = walker.f_back
    return innermost


def _frame(frame: FrameType) -> str:
    parts = frame.f_code.co_filename.replace("\\", "/").split("/")
    return f"{'/'.join(parts[-2:])}:{frame.f_lineno} ({frame.f_code.co_name})"


# -- is this process doing anything? -------------------------------------------------------------
class _Activity:
    """Whether this process (with its child processes, e.g. data-loader workers) is doing anything.

    Activity is CPU time (the process and its children) and storage I/O; socket traffic is left
    out, since the watchdog's own store traffic would count. The children and I/O are read only
    while the process itself uses no CPU.
    """

    def __init__(self) -> None:
        self._cpu = time.process_time()
        self._others: tuple[float, int] | None = None
        self._quiet_since = time.monotonic()

    def idle_for(self, now: float) -> float:
        cpu = time.process_time()
        # The watchdog itself and the backends' threads use a little CPU when nothing happens.
        active = cpu - self._cpu > 0.05 * TICK_SECONDS
        self._cpu = cpu
        if active:
            self._others = None
        else:
            others = (_children_cpu(), _storage_bytes())
            last, self._others = self._others, others
            active = last is None or others[0] - last[0] > 0.05 * TICK_SECONDS or others[1] != last[1]
        if active:
            self._quiet_since = now
        return now - self._quiet_since


def _children_cpu() -> float:
    """CPU seconds of this process's live child processes (Linux; 0 elsewhere)."""
    try:
        tasks = os.listdir("/proc/self/task")
        ticks = os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, AttributeError):
        return 0.0
    total = 0.0
    for task in tasks:
        try:
            with open(f"/proc/self/task/{task}/children") as file:
                children = file.read().split()
        except OSError:
            continue
        for child in children:
            try:
                with open(f"/proc/{child}/stat") as file:
                    fields = file.read().rsplit(")", 1)[1].split()
                total += (int(fields[11]) + int(fields[12])) / ticks
            except (OSError, IndexError, ValueError):
                continue
    return total


def _storage_bytes() -> int:
    """Bytes this process read from and wrote to storage so far (Linux; 0 elsewhere)."""
    try:
        with open("/proc/self/io") as file:
            values = dict(line.split(":", 1) for line in file.read().splitlines() if ":" in line)
        return int(values.get("read_bytes", 0)) + int(values.get("write_bytes", 0))
    except (OSError, ValueError):
        return 0
