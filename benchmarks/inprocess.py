"""Several training programs in one process, taking turns in blocks of optimizer steps (A/B runs).

Fresh processes cannot resolve per-step differences of one or two percent on a shared machine:
two processes of the same program differ by more than that (memory placement, what else ran).
Here every variant is built once, in one process, and the variants advance in turns of
``block_steps`` optimizer steps, round after round, so that a slow phase of the machine lands on
all of them; the ratio of each block to the raw loop's block of the same round is one paired
observation, and many rounds give a tight interval (see :mod:`benchmarks.intervals`).

Each variant's training function runs unchanged in a thread of its own, and only one thread runs
at a time. The hand-over point is the end of an optimizer step, caught by torch's global
optimizer step post-hook (the same clock as the fresh-process cases): when a variant finishes its
block, the hook stamps the time, wakes the scheduler and waits for the variant's next turn. A block's
time runs from the moment its thread resumes to the end of its last step, so it spans exactly
``block_steps`` step intervals, including whatever the framework does between steps, and none of
the hand-over.

The order within a round follows a Williams design (a balanced Latin square): over one cycle of
the design every variant runs in every position equally often and directly after every other
variant equally often, so that a variant which leaves the caches cold for its successor charges
everyone alike.
"""

from __future__ import annotations

import gc
import threading
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any


def williams_orders(count: int) -> list[list[int]]:
    """The rows of a Williams design for ``count`` variants (indices ``0..count-1``).

    ``count`` rows when it is even, ``2 * count`` when it is odd (the rows and their reverses).
    Over all rows, each index takes each position equally often, and each ordered pair
    ``(a, b)`` with ``a != b`` appears as neighbours (``b`` right after ``a``) equally often.
    """
    if count < 1:
        raise ValueError(f"a Williams design needs at least one variant, got {count}")
    first = [0]
    low, high = 1, count - 1
    while len(first) < count:
        first.append(low)
        low += 1
        if len(first) < count:
            first.append(high)
            high -= 1
    rows = [[(value + shift) % count for value in first] for shift in range(count)]
    if count % 2 == 1:
        rows += [list(reversed(row)) for row in rows]
    return rows


def schedule(names: Sequence[str], rounds: int, first_row: int = 0) -> list[list[str]]:
    """The order of the variants in each of ``rounds`` rounds, cycling through a Williams design.

    ``first_row`` starts the cycle elsewhere (processes of one case start on different rows).
    """
    if rounds < 1:
        raise ValueError(f"rounds must be at least 1, got {rounds}")
    rows = williams_orders(len(names))
    return [[names[i] for i in rows[(first_row + r) % len(rows)]] for r in range(rounds)]


class TurnError(RuntimeError):
    """A variant did not hand over within the time allowed (it hangs, or it is far too slow)."""


class StopTraining(BaseException):
    """Raised inside a variant's training at its hand-over once the run's deadline has passed.

    A ``BaseException``, like ``KeyboardInterrupt``, so that no framework's ``except Exception``
    swallows it; the frameworks' own clean-up on the way out runs as for any error.
    """


@dataclass
class _Driver:
    name: str
    function: Callable[[], Any]
    go: threading.Semaphore = field(default_factory=lambda: threading.Semaphore(0))
    thread: threading.Thread | None = None
    # Steps to take before the next hand-over; None: run to the end without stopping.
    quota: int | None = 0
    steps_in_turn: int = 0
    steps: int = 0
    timed: bool = False
    resumed: tuple[float, float] = (0.0, 0.0)
    blocks: list[tuple[float, float]] = field(default_factory=list)
    finished: bool = False
    stop: bool = False
    stopped: bool = False
    result: Any = None
    error: str | None = None


@dataclass
class Outcome:
    """What one variant did: its block times (seconds, one per round), steps, result or error.

    ``stopped``: the run's deadline ended its training early (after whole rounds), so it has no result.
    """

    name: str
    blocks: list[float]
    steps: int
    result: Any = None
    error: str | None = None
    stopped: bool = False


class Turns:
    """Runs training functions in threads, one at a time, switching every ``block_steps`` steps.

    Args:
        functions: name -> a function that trains (calling ``optimizer.step()`` the number of
            times the caller planned: ``warmup_steps + rounds * block_steps``) and returns
            whatever the caller needs afterwards (the trained model, say).
        warmup_steps: steps of each variant's first turn (with its set-up), not timed.
        block_steps: steps per timed turn.
        turn_timeout_s: a turn that has not handed over after this long fails the run.
        register_hook: installs the step hook and returns a handle with ``remove()``
            (torch's ``register_optimizer_step_post_hook``; injectable for tests).
        first_row: where in the Williams design the rounds start.
        synchronize: called at the end of every turn before its time is taken (on a GPU,
            ``torch.cuda.synchronize``: the host queues kernels ahead of the device, and a block
            is over when the device has run them).
    """

    def __init__(
        self,
        functions: Mapping[str, Callable[[], Any]],
        *,
        warmup_steps: int,
        block_steps: int,
        turn_timeout_s: float = 120.0,
        register_hook: Callable[[Callable[..., None]], Any],
        first_row: int = 0,
        synchronize: Callable[[], None] | None = None,
    ) -> None:
        if block_steps < 1 or warmup_steps < 1:
            raise ValueError(f"block_steps and warmup_steps must be >= 1, got {block_steps}, {warmup_steps}")
        self._drivers = {name: _Driver(name, function) for name, function in functions.items()}
        self._by_thread: dict[int, _Driver] = {}
        self._handed_over = threading.Semaphore(0)
        self.warmup_steps = warmup_steps
        self.block_steps = block_steps
        self.turn_timeout_s = turn_timeout_s
        self._register_hook = register_hook
        self.first_row = first_row
        self._synchronize = synchronize

    def run(
        self,
        rounds: int,
        log: Callable[[str], None] = lambda _: None,
        *,
        deadline: float | None = None,
        min_rounds: int = 0,
        hard_deadline: float | None = None,
        on_round: Callable[[int, dict[str, tuple[float, float]]], None] | None = None,
    ) -> dict[str, Outcome]:
        """Set-up and warm-up turns, then ``rounds`` rounds of timed blocks, then every variant's end.

        Args:
            deadline: ``time.monotonic()`` after which no new round starts once ``min_rounds``
                rounds are done; the variants then stop where they are (:class:`StopTraining` at
                their hand-over) instead of running their remaining steps, and their outcomes say
                ``stopped``.
            min_rounds: rounds to run past ``deadline`` (the fewest that give an interval), as
                long as ``hard_deadline`` allows.
            hard_deadline: no new round starts if, by the previous round's length, it would end
                after this.
            on_round: called after each round with its index and every variant's (wall, CPU)
                block, so that a caller can keep what was measured should the process be killed.
        """
        order = schedule(list(self._drivers), rounds, self.first_row)
        handle = self._register_hook(self._on_step)
        try:
            for driver in self._drivers.values():
                driver.thread = threading.Thread(
                    target=self._body, args=(driver,), name=f"ab-{driver.name}", daemon=True
                )
                driver.thread.start()
                self._by_thread[driver.thread.ident or 0] = driver
            for driver in self._drivers.values():
                self._turn(driver, self.warmup_steps, timed=False)
            # Everything set up so far (torch, the frameworks, the models) leaves the collector's
            # view: a full collection then costs what the variants' per-step garbage costs, instead
            # of a pause proportional to the whole heap landing in one variant's block.
            gc.collect()
            gc.freeze()
            stopping = False
            last_round = 0.0
            for index, names in enumerate(order):
                now = time.monotonic()
                soft = deadline is not None and now >= deadline and index >= min_rounds
                hard = hard_deadline is not None and now + last_round >= hard_deadline
                if soft or hard:
                    log(f"    deadline reached after {index} of {rounds} rounds")
                    stopping = True
                    break
                for name in names:
                    self._turn(self._drivers[name], self.block_steps, timed=True)
                last_round = time.monotonic() - now
                if on_round is not None:
                    on_round(
                        index, {d.name: d.blocks[-1] for d in self._drivers.values() if len(d.blocks) > index}
                    )
                if (index + 1) % max(1, rounds // 10) == 0:
                    log(f"    round {index + 1}/{rounds}")
            for driver in self._drivers.values():
                driver.stop = stopping
                self._turn(driver, None, timed=False)
        finally:
            handle.remove()
            gc.unfreeze()
        return {
            d.name: Outcome(d.name, list(d.blocks), d.steps, d.result, d.error, d.stopped)
            for d in self._drivers.values()
        }

    def _turn(self, driver: _Driver, quota: int | None, *, timed: bool) -> None:
        if driver.finished:
            return
        driver.quota, driver.steps_in_turn, driver.timed = quota, 0, timed
        driver.go.release()
        if not self._handed_over.acquire(timeout=self.turn_timeout_s):
            raise TurnError(
                f"{driver.name} did not finish its turn of {quota} steps within {self.turn_timeout_s:.0f} s "
                f"(after {driver.steps} steps in all)"
            )
        if driver.finished and quota is not None and driver.error is None:
            driver.error = (
                f"its training ended after {driver.steps} optimizer steps, during a turn that needed "
                f"{quota - driver.steps_in_turn} more: it takes fewer steps than the case planned"
            )

    def _body(self, driver: _Driver) -> None:
        driver.go.acquire()
        driver.resumed = _clocks()
        try:
            driver.result = driver.function()
        except StopTraining:
            driver.stopped = True
        except BaseException as error:
            # A framework may wrap the stop in an error of its own: it is still the stop.
            if _caused_by_stop(error):
                driver.stopped = True
            else:
                driver.error = traceback.format_exc().strip()
        driver.finished = True
        self._handed_over.release()

    def _on_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        now = _clocks()
        driver = self._by_thread.get(threading.get_ident())
        if driver is None:  # a step outside the variants' threads: not ours to schedule
            return
        driver.steps += 1
        driver.steps_in_turn += 1
        if driver.quota is None or driver.steps_in_turn < driver.quota:
            return
        if self._synchronize is not None:
            self._synchronize()
            now = _clocks()
        if driver.timed:
            driver.blocks.append((now[0] - driver.resumed[0], now[1] - driver.resumed[1]))
        self._handed_over.release()
        driver.go.acquire()
        if driver.stop:
            raise StopTraining
        driver.resumed = _clocks()


def _caused_by_stop(error: BaseException | None) -> bool:
    seen = 0
    while error is not None and seen < 10:
        if isinstance(error, StopTraining):
            return True
        error, seen = error.__cause__ or error.__context__, seen + 1
    return False


def _clocks() -> tuple[float, float]:
    """(wall, CPU) seconds: the CPU clock counts every thread of this process, no other program."""
    return time.perf_counter(), time.process_time()
