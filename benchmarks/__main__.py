"""``python -m benchmarks run [--quick]``: run the suite and write ``benchmarks/results/``.

Examples::

    .venv/bin/python -m benchmarks run                 # everything; results/latest.{json,md}
    .venv/bin/python -m benchmarks run --quick         # smoke run, < 2 min; results/quick.{json,md}
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

from benchmarks.harness import Context
from benchmarks.peers import ensure_peers_venv, probe_versions
from benchmarks.report import CaseResult, describe_machine, render_markdown, write_results

RESULTS = Path(__file__).resolve().parent / "results"
CPU_CASES = ("import_time", "step_time", "ddp")
ALL_CASES = (*CPU_CASES, "gpu")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="run the benchmark cases and write the results")
    run.add_argument("--quick", action="store_true", help="fewer rounds and steps (under two minutes)")
    run.add_argument(
        "--cases",
        default=",".join(ALL_CASES),
        help=f"comma-separated subset of {','.join(ALL_CASES)} (default: all; gpu only runs where CUDA is)",
    )
    run.add_argument("--no-peers", action="store_true", help="leave out Lightning, Fabric and Accelerate")
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
    args = parser.parse_args(argv)

    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    unknown = sorted(set(cases) - set(ALL_CASES))
    if unknown:
        parser.error(f"unknown case(s) {unknown}; choose from {', '.join(ALL_CASES)}")

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
    )
    machine = describe_machine()
    machine["interpreters"] = {"project": probe_versions(args.python, ("torch", "drivetrain"))}
    if peers_python is not None:
        machine["interpreters"]["peers"] = probe_versions(peers_python, ("torch", "lightning", "accelerate"))
    setup_s = time.perf_counter() - started

    cpu_results: list[CaseResult] = []
    gpu_results: list[CaseResult] = []
    for name in cases:
        case_started = time.perf_counter()
        _log(f"== {name}")
        module = importlib.import_module(f"benchmarks.cases.{name}")
        outcome = module.run(context)
        (gpu_results if name == "gpu" else cpu_results).append(outcome)
        _log(f"== {name}: {time.perf_counter() - case_started:.0f} s")

    problems = [p for r in [*cpu_results, *gpu_results] for p in r.problems]
    if cpu_results:
        complete = set(CPU_CASES) <= set(cases) and context.only is None
        stem = "quick" if args.quick else ("latest" if complete else "partial")
        title = "drivetrain benchmarks" + (" (quick run)" if args.quick else "")
        paths = write_results(args.output_dir, stem, title, machine, cpu_results)
        _log(f"wrote {paths[0]} and {paths[1]}")
        print(render_markdown(title, machine, cpu_results))
    for outcome in gpu_results:
        if outcome.skipped or context.gpu_dry_run or context.only is not None:
            print(
                render_markdown(
                    "drivetrain GPU benchmarks", {**machine, **outcome.data.get("machine", {})}, [outcome]
                )
            )
            continue
        gpu_machine = {**machine, **outcome.data.get("machine", {})}
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


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _terminate(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


if __name__ == "__main__":
    # SIGTERM as an exception, so that the running sample's process group is killed on the way out.
    signal.signal(signal.SIGTERM, _terminate)
    sys.exit(main())
