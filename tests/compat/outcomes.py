"""From the ranks' records of one script run to a status per sub-test, and what was expected.

Statuses: ``pass``, ``fail``, ``not run`` (``main()`` stopped before it, or it hung), and, for
display, ``n/a`` (does not apply on CPU, see the manifest) and ``differs`` (drivetrain differs on
purpose).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from manifest import Script, lookup

MAIN = "<main>"
IMPORT = "<import>"


@dataclasses.dataclass(frozen=True)
class Outcome:
    status: str  # pass / fail / not run
    errors: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class Cell:
    """One sub-test at one world size: what happened, what the table shows, and whether it was expected."""

    subtest: str
    outcome: Outcome
    shown: str
    expected: bool
    note: str | None = None


def read_records(results: Path) -> dict[int, list[dict[str, object]]]:
    records: dict[int, list[dict[str, object]]] = {}
    for path in sorted(results.glob("rank*.jsonl")):
        rank = int(path.stem.removeprefix("rank"))
        records[rank] = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return records


def merge(records: dict[int, list[dict[str, object]]], world_size: int) -> dict[str, Outcome]:
    """One outcome per sub-test over the ranks: a failure anywhere fails it, a rank missing fails it."""
    by_id: dict[str, dict[int, dict[str, object]]] = {}
    for rank, lines in records.items():
        for line in lines:
            by_id.setdefault(str(line["id"]), {})[rank] = line
    merged = {}
    for subtest, ranks in by_id.items():
        errors = tuple(
            f"rank {rank}: {line['error']}" for rank, line in sorted(ranks.items()) if "error" in line
        )
        if errors:
            merged[subtest] = Outcome("fail", errors)
        elif len(ranks) < world_size:
            missing = sorted(set(range(world_size)) - set(ranks))
            merged[subtest] = Outcome("fail", (f"ranks {missing} never finished it",))
        else:
            merged[subtest] = Outcome("pass")
    return merged


def cells(script: Script, world_size: int, outcomes: dict[str, Outcome], planned: list[str]) -> list[Cell]:
    """Every sub-test of ``script`` at ``world_size`` with its expected/actual status.

    ``planned`` names the sub-tests that exist (``main()``'s calls and the extras); those with no
    record are ``not run``.
    """
    if world_size in script.script_not_applicable:
        return [
            Cell(name, Outcome("not run"), "n/a", True, script.script_not_applicable[world_size])
            for name in planned
        ]
    seen = {subtest.split("(", 1)[0].split("[", 1)[0] for subtest in outcomes}
    rows = [name for name in planned if name not in seen] + [s for s in outcomes if s not in (MAIN, IMPORT)]
    stopped = (
        IMPORT
        if IMPORT in outcomes
        else MAIN
        if outcomes.get(MAIN, Outcome("pass")).status != "pass"
        else None
    )
    blocked_by_gap = stopped is not None and lookup(script.known_gaps, stopped) is not None
    result = []
    for subtest in rows:
        outcome = outcomes.get(subtest, Outcome("not run"))
        result.append(_cell(script, world_size, subtest, outcome, blocked_by_gap))
    for special in (IMPORT, MAIN):
        if special in outcomes:
            result.append(_cell(script, world_size, special, outcomes[special], False))
    if MAIN not in outcomes and IMPORT not in outcomes:
        result.append(
            Cell(MAIN, Outcome("not run"), "not run", False, "the script never finished (hang or crash)")
        )
    return result


def _cell(script: Script, world_size: int, subtest: str, outcome: Outcome, blocked_by_gap: bool) -> Cell:
    status = outcome.status
    not_applicable = lookup(script.not_applicable, subtest)
    if not_applicable is not None and world_size in not_applicable.world_sizes:
        return Cell(subtest, outcome, "n/a", status in ("pass", "not run"), not_applicable.text)
    if status == "not run" and blocked_by_gap:
        return Cell(subtest, outcome, status, True, "not reached: the script stopped earlier (see <main>)")
    differs = lookup(script.differs, subtest)
    if differs is not None and world_size in differs.world_sizes:
        return Cell(subtest, outcome, "differs", status == "fail", differs.text)
    gap = lookup(script.known_gaps, subtest)
    if gap is not None:
        return Cell(subtest, outcome, status, status == "fail", gap)
    return Cell(subtest, outcome, status, status == "pass")


def unexpected(script: Script, world_size: int, found: list[Cell]) -> list[str]:
    """Human-readable mismatches between expected and actual statuses."""
    problems = []
    for cell in found:
        if cell.expected:
            continue
        details = "; ".join(cell.outcome.errors)
        if cell.outcome.status == "pass" and (
            cell.shown == "differs" or lookup(script.known_gaps, cell.subtest) is not None
        ):
            problems.append(
                f"{script.name} on {world_size} process(es): {cell.subtest} now passes; "
                f"remove it from the manifest's known_gaps/differs"
            )
        else:
            problems.append(
                f"{script.name} on {world_size} process(es): {cell.subtest} {cell.outcome.status}"
                + (f" ({details})" if details else "")
            )
    return problems
