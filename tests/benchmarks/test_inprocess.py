# ruff: noqa: RUF001 (units use typographic signs on purpose)
"""The A/B scheduler: balanced orders, one variant at a time, blocks handed over at step ends."""

from __future__ import annotations

import itertools
import math
import threading
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from benchmarks.cases.ab import precise_enough
from benchmarks.cases.ddp.ab import measurements as ddp_measurements
from benchmarks.cases.ddp.ab import precise_enough as ddp_precise_enough
from benchmarks.inprocess import TurnError, Turns, schedule, williams_orders
from benchmarks.intervals import Measurement, Scale
from benchmarks.sources import Source
from torch.optim.optimizer import register_optimizer_step_post_hook


@pytest.mark.parametrize("count", range(1, 9))
def test_williams_orders_balance_positions_and_neighbours(count: int) -> None:
    rows = williams_orders(count)
    assert len(rows) == (count if count % 2 == 0 else 2 * count)
    for row in rows:
        assert sorted(row) == list(range(count))
    positions = Counter((position, value) for row in rows for position, value in enumerate(row))
    assert len(set(positions.values())) == 1 and len(positions) == count * count
    if count > 1:
        neighbours = Counter((a, b) for row in rows for a, b in itertools.pairwise(row))
        assert len(neighbours) == count * (count - 1)  # every ordered pair of distinct variants
        assert len(set(neighbours.values())) == 1  # equally often


def test_schedule_cycles_through_the_design_from_a_chosen_row() -> None:
    names = ["raw", "a", "b", "c"]
    rounds = schedule(names, 6)
    assert rounds[:4] == [[names[i] for i in row] for row in williams_orders(4)]
    assert rounds[4:] == rounds[:2]
    assert schedule(names, 3, first_row=1) == rounds[1:4]
    with pytest.raises(ValueError, match="rounds must be at least 1"):
        schedule(names, 0)
    with pytest.raises(ValueError, match="at least one variant"):
        williams_orders(0)


class FakeOptimizer:
    """Calls the registered step hooks, as torch's optimizer step post-hooks would be called."""

    hooks: list[Callable[..., None]] = []

    @classmethod
    def register(cls, hook: Callable[..., None]) -> Any:
        cls.hooks.append(hook)

        class Handle:
            def remove(self) -> None:
                cls.hooks.remove(hook)

        return Handle()

    @classmethod
    def step(cls) -> None:
        for hook in list(cls.hooks):
            hook(None, (), {})


def _training(name: str, steps: int, events: list[tuple[str, int]], running: list[int]) -> Callable[[], str]:
    def train() -> str:
        for step in range(steps):
            running[0] += 1
            assert running[0] == 1, "two variants ran at once"
            events.append((name, step))
            running[0] -= 1
            FakeOptimizer.step()
        return f"{name} done"

    return train


def test_variants_take_turns_in_blocks_in_the_scheduled_order() -> None:
    events: list[tuple[str, int]] = []
    running = [0]
    warmup, block, rounds = 2, 3, 4
    total = warmup + rounds * block
    names = ["raw", "a", "b"]
    turns = Turns(
        {n: _training(n, total, events, running) for n in names},
        warmup_steps=warmup,
        block_steps=block,
        register_hook=FakeOptimizer.register,
    )
    outcomes = turns.run(rounds)
    assert FakeOptimizer.hooks == []  # the hook is removed afterwards
    # Who ran, block by block: first every warm-up turn, then the rounds in the design's order.
    runs = [events[0][0]]
    for (previous, _), (name, _) in itertools.pairwise(events):
        if name != previous:
            runs.append(name)
    expected = names + [n for order in schedule(names, rounds) for n in order]
    assert _collapse(runs) == _collapse(expected)
    for name in names:
        steps = [s for n, s in events if n == name]
        assert steps == list(range(total))
        outcome = outcomes[name]
        assert outcome.error is None and outcome.result == f"{name} done" and outcome.steps == total
        assert len(outcome.blocks) == rounds  # the warm-up turn is not timed
        assert all(wall >= 0 and cpu >= 0 for wall, cpu in outcome.blocks)


def _collapse(names: list[str]) -> list[str]:
    """Neighbouring turns of the same variant look like one run of events."""
    return [n for i, n in enumerate(names) if i == 0 or names[i - 1] != n]


def test_a_variant_that_fails_is_reported_and_the_others_finish() -> None:
    events: list[tuple[str, int]] = []
    running = [0]

    def broken() -> None:
        FakeOptimizer.step()
        FakeOptimizer.step()
        FakeOptimizer.step()
        raise RuntimeError("the framework gave up")

    turns = Turns(
        {"raw": _training("raw", 2 + 3 * 2, events, running), "broken": broken},
        warmup_steps=2,
        block_steps=2,
        register_hook=FakeOptimizer.register,
    )
    outcomes = turns.run(3)
    assert "RuntimeError: the framework gave up" in outcomes["broken"].error
    assert outcomes["raw"].error is None and len(outcomes["raw"].blocks) == 3


def test_a_variant_that_stops_early_is_an_error_not_a_short_block() -> None:
    events: list[tuple[str, int]] = []
    running = [0]
    turns = Turns(
        {
            "raw": _training("raw", 1 + 2 * 2, events, running),
            "short": _training("short", 2, events, running),
        },
        warmup_steps=1,
        block_steps=2,
        register_hook=FakeOptimizer.register,
    )
    outcomes = turns.run(2)
    assert "ended after 2 optimizer steps" in outcomes["short"].error
    assert outcomes["short"].blocks == []


def test_a_variant_that_hangs_stops_the_run_with_its_name() -> None:
    release = threading.Event()

    def hangs() -> None:
        release.wait(30)

    turns = Turns(
        {"hangs": hangs},
        warmup_steps=1,
        block_steps=1,
        turn_timeout_s=0.3,
        register_hook=FakeOptimizer.register,
    )
    try:
        with pytest.raises(TurnError, match="hangs did not finish its turn of 1 steps"):
            turns.run(1)
    finally:
        release.set()
    assert FakeOptimizer.hooks == []


def test_turns_with_torch_optimizers_train_exactly_like_separate_runs() -> None:
    torch.set_num_threads(1)

    def loop(steps: int) -> Callable[[], torch.Tensor]:
        def train() -> torch.Tensor:
            torch.manual_seed(0)
            model = torch.nn.Linear(4, 1)
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            data = torch.randn(steps, 8, 4, generator=torch.Generator().manual_seed(1))
            for batch in data:
                optimizer.zero_grad()
                model(batch).pow(2).mean().backward()
                optimizer.step()
            return model.weight.detach().clone()

        return train

    steps = 3 + 5 * 4
    alone = loop(steps)()
    outcomes = Turns(
        {"a": loop(steps), "b": loop(steps)},
        warmup_steps=3,
        block_steps=4,
        register_hook=register_optimizer_step_post_hook,
    ).run(5)
    for outcome in outcomes.values():
        assert outcome.error is None and outcome.steps == steps and len(outcome.blocks) == 5
        assert torch.equal(outcome.result, alone)


def _cpu_ratio(name: str, spread: float) -> Measurement:
    values = [math.log(1.01) + spread * ((i * 7 % 11) - 5) / 5 for i in range(120)]
    return Measurement(f"ab/tiny/{name}/cpu", name, Scale.RATIO, "× raw", [values])


def test_the_ab_case_adds_processes_until_every_drivetrain_ratio_is_precise() -> None:
    tight, loose = _cpu_ratio("drivetrain_accelerator@after", 0.01), _cpu_ratio("drivetrain_trainer", 0.2)
    assert precise_enough([tight], 0.008)
    assert not precise_enough([tight, loose], 0.008)
    # The peers' precision does not hold the case up; neither does the wall clock.
    assert precise_enough([tight, _cpu_ratio("lightning_trainer", 0.2)], 0.008)
    wall = Measurement("ab/tiny/drivetrain_trainer/wall", "w", Scale.RATIO, "× raw", loose.groups)
    assert precise_enough([tight, wall], 0.008)
    assert not precise_enough(
        [Measurement("ab/tiny/drivetrain_trainer/cpu", "x", Scale.RATIO, "× raw", [])], 0.008
    )


def test_the_ddp_ab_pairs_each_door_with_raw_per_round_and_gates_on_the_wall_clock() -> None:
    def launch(scale: float, noise: float) -> dict:
        raw = [0.1 * (1 + noise * ((i * 5 % 7) - 3) / 3) for i in range(36)]
        return {
            "variants": {
                "raw": {"wall_s": raw, "cpu_s": raw, "error": None},
                # Each block of the door pairs with raw's block of the same round: the shared
                # noise cancels, only the door's own cost is left.
                "drivetrain_trainer": {"wall_s": [r * scale for r in raw], "cpu_s": raw, "error": None},
            }
        }

    chosen = {"raw": {}, "drivetrain_trainer": {}}
    found = ddp_measurements([launch(1.004, 0.2), launch(1.004, 0.05)], chosen, Source("after", Path("x")))
    by_key = {m.key: m for m in found}
    wall = by_key["ddp/ab/drivetrain_trainer@after/wall"]
    assert wall.limit == 1.02 and wall.interval.estimate == pytest.approx(1.004)
    assert wall.interval.high - wall.interval.low < 1e-9 and wall.decision.value == "met"
    assert by_key["ddp/ab/drivetrain_trainer@after/cpu"].limit is None
    assert ddp_precise_enough(found, 0.005)
    # Only the targeted (wall-clock) ratios hold the launches up.
    spread = Measurement("ddp/ab/x/wall", "x", Scale.RATIO, "× raw", [[0.0, 0.02, -0.02] * 4], 1.02)
    assert not ddp_precise_enough([*found, spread], 0.005)
    spread.limit = None
    assert ddp_precise_enough([*found, spread], 0.005)


def test_each_turn_waits_for_the_device_before_its_time_is_taken() -> None:
    events: list[tuple[str, int]] = []
    running = [0]
    waits: list[int] = []
    turns = Turns(
        {n: _training(n, 1 + 3 * 2, events, running) for n in ("raw", "a")},
        warmup_steps=1,
        block_steps=2,
        register_hook=FakeOptimizer.register,
        synchronize=lambda: waits.append(len(events)),
    )
    turns.run(3)
    # Once at the end of every turn (warm-up turns and timed blocks), after its last step.
    assert len(waits) == 2 + 3 * 2
    assert all(events[count - 1][1] in (0, 2, 4, 6) for count in waits)


def test_a_deadline_stops_every_variant_after_whole_rounds_and_keeps_what_was_measured() -> None:
    events: list[tuple[str, int]] = []
    running = [0]
    recorded: list[tuple[int, dict[str, Any]]] = []
    clock = [0.0]
    names = ("raw", "a", "b")

    def advancing(name: str) -> Callable[[], str]:
        inner = _training(name, 1 + 10 * 2, events, running)

        def train() -> str:
            clock[0] += 1  # each variant's set-up "takes a second"
            return inner()

        return train

    turns = Turns(
        {n: advancing(n) for n in names},
        warmup_steps=1,
        block_steps=2,
        register_hook=FakeOptimizer.register,
    )
    import benchmarks.inprocess as inprocess

    real = inprocess.time.monotonic
    inprocess.time.monotonic = lambda: clock[0] + 3 * len(recorded)  # type: ignore[assignment]
    try:
        outcomes = turns.run(10, deadline=8.5, on_round=lambda i, blocks: recorded.append((i, blocks)))
    finally:
        inprocess.time.monotonic = real  # type: ignore[assignment]
    assert not running[0]
    # Set-up took 3 "seconds" and every round 3 more: rounds 0 and 1 ran, then the deadline.
    assert [index for index, _ in recorded] == [0, 1]
    assert all(set(blocks) == set(names) for _, blocks in recorded)
    for name in names:
        outcome = outcomes[name]
        assert outcome.stopped and outcome.error is None and outcome.result is None
        assert outcome.steps == 1 + 2 * 2 and len(outcome.blocks) == 2
    assert FakeOptimizer.hooks == []


@pytest.mark.parametrize(("hard", "expected"), [(None, 3), (14.5, 3), (11.5, 2)])
def test_the_deadline_waits_for_the_rounds_an_interval_needs_unless_the_hard_one_comes_first(
    hard: float | None, expected: int
) -> None:
    events: list[tuple[str, int]] = []
    running = [0]
    recorded: list[int] = []
    turns = Turns(
        {n: _training(n, 1 + 10 * 2, events, running) for n in ("raw", "a")},
        warmup_steps=1,
        block_steps=2,
        register_hook=FakeOptimizer.register,
    )
    import benchmarks.inprocess as inprocess

    real = inprocess.time.monotonic
    # Set-up ends at 3 "seconds", every round takes 3: rounds start at 3, 6, 9, 12 ...
    ticks = iter([v for r in range(11) for v in (3.0 + 3 * r, 6.0 + 3 * r)])
    inprocess.time.monotonic = lambda: next(ticks)  # type: ignore[assignment]
    try:
        outcomes = turns.run(
            10, deadline=4.0, min_rounds=3, hard_deadline=hard, on_round=lambda i, blocks: recorded.append(i)
        )
    finally:
        inprocess.time.monotonic = real  # type: ignore[assignment]
    assert len(recorded) == expected
    assert all(o.stopped and len(o.blocks) == expected for o in outcomes.values())
