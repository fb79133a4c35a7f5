"""``python -m benchmarks run``: run the suite; ``python -m benchmarks --compare OLD NEW``: compare two runs.

Examples::

    .venv/bin/python -m benchmarks run                 # everything; results/latest.{json,md}
    .venv/bin/python -m benchmarks run --quick         # smoke run, < 3 min; results/quick.{json,md}
    .venv/bin/python -m benchmarks run --no-peers \\
        --drivetrain-src before=/work/wt/before/src --drivetrain-src after=src   # two trees, one run
    .venv/bin/python -m benchmarks --compare old.json benchmarks/results/latest.json
    .venv/bin/python -m benchmarks run --cases gpu --gpu-dry-run   # the GPU case's scripts on CPU
    python3 -m benchmarks run --cases gpu --python python3 --peers-python python3   # on a CUDA box
"""

from __future__ import annotations

import argparse
import importlib
import signal
import sys
import time
from pathlib import Path

from benchmarks import load
from benchmarks.compare import CompareError, changes_table, render_comparison, source_changes
from benchmarks.harness import Context, compile_bytecode
from benchmarks.peers import ensure_peers_venv, probe_versions
from benchmarks.report import CaseResult, describe_machine, render_markdown, write_results
from benchmarks.sources import SourceError, parse_sources, trees_that_moved

BENCHMARKS = Path(__file__).resolve().parent
RESULTS = BENCHMARKS / "results"
CPU_CASES = ("import_time", "ab", "step_time", "ddp", "instructions")
ALL_CASES = (*CPU_CASES, "gpu")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--compare",
        nargs=2,
        metavar=("OLD.json", "NEW.json"),
        type=Path,
        help="print how every measurement changed from OLD to NEW, with its 95%% interval, and exit",
    )
    commands = parser.add_subparsers(dest="command")
    run = commands.add_parser("run", help="run the benchmark cases and write the results")
    run.add_argument("--quick", action="store_true", help="fewer rounds and steps (a smoke run)")
    run.add_argument(
        "--cases",
        default=",".join(ALL_CASES),
        help=f"comma-separated subset of {','.join(ALL_CASES)} (default: all; gpu only runs where CUDA is)",
    )
    run.add_argument("--no-peers", action="store_true", help="leave out Lightning, Fabric and Accelerate")
    run.add_argument(
        "--drivetrain-src",
        action="append",
        metavar="NAME=PATH",
        help="measure the drivetrain package in PATH (a checkout's src/) under NAME; repeat to measure several "
        "trees side by side in the same rounds, the first being the baseline (default: this checkout's src/)",
    )
    run.add_argument(
        "--rounds",
        type=_positive_int,
        default=None,
        help="rounds per case instead of each case's default (more rounds, narrower intervals, longer run)",
    )
    run.add_argument("--python", default=sys.executable, help="interpreter for raw PyTorch and drivetrain")
    run.add_argument(
        "--peers-python",
        default=None,
        help="interpreter for the peers (default: benchmarks/.peers-venv, created if absent)",
    )
    run.add_argument(
        "--gpu-dry-run", action="store_true", help="run the GPU case on CPU with a tiny model (checks only)"
    )
    run.add_argument(
        "--only",
        default=None,
        help="comma-separated variant names to run (plus each case's reference), for debugging",
    )
    run.add_argument(
        "--time-limit",
        type=float,
        default=None,
        help="seconds after which no new sample starts; the rest are reported as not run (for leased machines)",
    )
    run.add_argument("--output-dir", type=Path, default=RESULTS, help="where the result files go")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.compare is not None:
        if args.command is not None:
            parser.error("--compare prints a comparison and runs nothing; give it without `run`")
        try:
            print(render_comparison(*args.compare), end="")
        except CompareError as error:
            parser.error(str(error))
        return 0
    if args.command != "run":
        parser.error("give a command (`run`) or --compare OLD.json NEW.json")

    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    unknown = sorted(set(cases) - set(ALL_CASES))
    if unknown:
        parser.error(f"unknown case(s) {unknown}; choose from {', '.join(ALL_CASES)}")
    try:
        sources = parse_sources(args.drivetrain_src)
    except SourceError as error:
        parser.error(str(error))

    started = time.perf_counter()
    peers_python = None
    if not args.no_peers:
        peers_python = args.peers_python or str(ensure_peers_venv())
    context = Context(
        quick=args.quick,
        python=args.python,
        peers_python=peers_python,
        gpu_dry_run=args.gpu_dry_run,
        only=frozenset(args.only.split(",")) if args.only else None,
        deadline=None if args.time_limit is None else time.monotonic() + args.time_limit,
        log=_log,
        sources=sources,
        rounds=args.rounds,
    )
    machine = describe_machine()
    machine["interpreters"] = {"project": probe_versions(args.python, ("torch", "drivetrain"))}
    if peers_python is not None:
        machine["interpreters"]["peers"] = probe_versions(peers_python, ("torch", "lightning", "accelerate"))
    if args.drivetrain_src:
        machine["drivetrain_sources"] = {s.name: s.describe() for s in sources}
    bytecode_problems = [
        problem
        for interpreter in dict.fromkeys(filter(None, [args.python, peers_python]))
        # A published run also compiles the installed packages; a quick (smoke) run's times compare nothing.
        if (
            problem := compile_bytecode(
                interpreter, [*(s.path for s in sources), BENCHMARKS], _log, installed=not args.quick
            )
        )
    ]
    machine["bytecode"] = (
        "written before the cases" if not bytecode_problems else "; ".join(bytecode_problems)
    )
    setup_s = time.perf_counter() - started

    cpu_results: list[CaseResult] = []
    gpu_results: list[CaseResult] = []
    for name in [c for c in ALL_CASES if c in cases]:
        case_started = time.perf_counter()
        _log(f"== {name}")
        before = load.probe()
        module = importlib.import_module(f"benchmarks.cases.{name}")
        outcome = module.run(context)
        after = load.probe()
        outcome.load = {"before": before.as_dict(), "after": after.as_dict()}
        warning = load.warning(name, before, after)
        if warning is not None and name != "instructions":
            outcome.warnings.append(warning)
            _log("WARNING: " + warning)
        (gpu_results if name == "gpu" else cpu_results).append(outcome)
        _log(f"== {name}: {time.perf_counter() - case_started:.0f} s (load before: {before.describe()})")

    if args.drivetrain_src:
        moved = trees_that_moved(machine["drivetrain_sources"], sources)
        for result in [*cpu_results, *gpu_results][:1]:
            result.warnings += moved
        for line in moved:
            _log("WARNING: " + line)
    for result in [*cpu_results, *gpu_results][:1]:
        result.warnings += [f"{p}: imports compile in every sample" for p in bytecode_problems]
    problems = [p for r in [*cpu_results, *gpu_results] for p in r.problems]
    names = [s.name for s in sources]
    if cpu_results:
        stem = _stem(
            args.quick, bool(args.drivetrain_src), set(CPU_CASES) <= set(cases) and context.only is None
        )
        title = "drivetrain benchmarks" + (" (quick run)" if args.quick else "")
        _add_tree_comparison(cpu_results, names)
        paths = write_results(args.output_dir, stem, title, machine, cpu_results)
        _log(f"wrote {paths[0]} and {paths[1]}")
        print(render_markdown(title, machine, cpu_results))
    for outcome in gpu_results:
        _add_tree_comparison([outcome], names)
        gpu_machine = {**machine, **outcome.data.get("machine", {})}
        if outcome.skipped or context.gpu_dry_run or context.only is not None:
            print(render_markdown("drivetrain GPU benchmarks", gpu_machine, [outcome]))
            continue
        paths = write_results(
            args.output_dir, "gpu-latest", "drivetrain GPU benchmarks", gpu_machine, [outcome]
        )
        _log(f"wrote {paths[0]} and {paths[1]}")
        print(render_markdown("drivetrain GPU benchmarks", gpu_machine, [outcome]))
    _log(f"total {time.perf_counter() - started:.0f} s (setup {setup_s:.0f} s)")
    if problems:
        print(
            "\nBENCHMARK PROBLEMS (the comparison is not trustworthy until these are fixed):", file=sys.stderr
        )
        for problem in problems:
            print("  - " + problem.replace("\n", "\n    "), file=sys.stderr)
        return 1
    return 0


def _stem(quick: bool, trees: bool, complete: bool) -> str:
    """Result file name: only a complete default run replaces ``latest``."""
    if quick:
        return "quick"
    if trees:
        return "trees"
    return "latest" if complete else "partial"


def _add_tree_comparison(results: list[CaseResult], names: list[str]) -> None:
    """With several drivetrain trees, each case gets a table of every tree against the first."""
    baseline = names[0]
    for result in results:
        for other in names[1:]:
            changes = source_changes(result.measurements, baseline, other)
            if changes:
                title = f"Trees compared: {other} against {baseline}"
                result.tables.append(changes_table(title, changes, baseline, other, drop=f" [{other}]"))


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number of rounds, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"rounds must be at least 1, got {value}")
    return value


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _terminate(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


if __name__ == "__main__":
    # SIGTERM as an exception, so that the running sample's process group is killed on the way out.
    signal.signal(signal.SIGTERM, _terminate)
    sys.exit(main())
