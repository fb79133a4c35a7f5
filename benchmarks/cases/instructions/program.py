"""One process of the instruction-count case, meant to run under ``valgrind --tool=callgrind``.

For every variant: the runs below twice uninstrumented (imports, first-call paths, allocators,
interpreter specialisation), then, with callgrind's instrumentation switched on, one discarded run
and three runs of ``steps[0] < steps[1] <
steps[2]`` optimizer steps, each counted alone (counters zeroed before, a named dump
``variant:steps`` after).
Every run pays the same set-up, so the difference between two dumps divided by the difference in
steps is the cost of one step — twice, from two pairs of runs, which must agree (the counts are
deterministic up to a few hundred instructions). The case reads the dumps after the process ends.

``BENCH_CONFIG``: training settings, ``variants`` (as in the A/B case), ``steps`` and ``marks`` (the client-request library the case compiled). Outside valgrind
the marks do nothing and the program still runs, which keeps it testable.
"""

from __future__ import annotations

import ctypes
import gc
import json

import torch

from benchmarks.cases import common
from benchmarks.cases.inprocess_variants import training_functions


def main() -> None:
    config = common.load_config()
    torch.set_num_threads(1)
    marks = ctypes.CDLL(config["marks"])
    marks.bench_dump.argtypes = [ctypes.c_char_p]
    functions = training_functions(config["variants"], config)
    steps = config["steps"]
    variants = {}
    # Warm-up without instrumentation (a few times native speed): the measured runs, twice, so
    # that Python's specialising interpreter, the allocators and the frameworks' caches have seen
    # every size and path; then, per variant, one instrumented run that is thrown away. Measured:
    # with one warm-up run the first counted run cost up to 2 M instructions more than later ones;
    # with this, runs of one length differ by ~50 k (hash order of addresses, say), and the first
    # difference still runs a few tenths of a percent low (see AGREEMENT). Every variant warms up
    # before any is counted: warmed and counted one after the other, the variants counted later
    # met a heap the earlier ones had fragmented (raw, counted first, then looked cheaper: ~8 k of
    # a variant's +21 k instructions per step over raw were glibc's malloc searching free lists).
    for _ in range(2):
        for train in functions.values():
            for count in steps:
                train(count)
    for name, train in functions.items():
        marks.bench_start()
        train(steps[0])
        model = None
        for count in steps:
            # The cyclic collector runs every ~700 allocations, so one run would hold a collection
            # more or less than its neighbour and the per-step counts would wobble by 0.5-1 %:
            # count with it off (the timed cases include its cost), from the same state every run.
            gc.collect()
            gc.disable()
            marks.bench_zero()
            model, _rank = train(count)
            marks.bench_dump(f"{name}:{count}".encode())
            gc.enable()
        marks.bench_stop()
        variants[name] = {"final_loss": common.final_loss(model, {**config, "total_steps": steps[-1]})}
    result = {
        "variants": variants,
        "steps": steps,
        "on_valgrind": bool(marks.bench_on_valgrind()),
        "drivetrain_file": common.drivetrain_file(),
        "torch": torch.__version__,
    }
    print(common.RESULT_PREFIX + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
