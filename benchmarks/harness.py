"""Runs benchmark variants as fresh processes, interleaved (A B C, A B C, …), and reads their results.

Every sample is a new process started from a clean environment: the settings travel as JSON in
``BENCH_CONFIG``, the wall-clock start of the command in ``BENCH_T0``, and the script answers with
one ``BENCH_RESULT {json}`` line. Interleaving spreads slow drifts of a shared machine (other load,
thermal state) over all variants instead of charging them to whichever ran last.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from benchmarks.cases.common import CONFIG_VARIABLE, RESULT_PREFIX, START_VARIABLE
from benchmarks.sources import Source, default_source

REPO_ROOT = Path(__file__).resolve().parents[1]

# Launcher and cluster variables of whatever started the suite must not leak into the samples:
# a script that sees RANK thinks torchrun started it.
_SCRUBBED = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "NODE_RANK",
    "GROUP_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RUN_ID",
    "DRIVETRAIN_ACCELERATOR",
    "SLURM_NTASKS",
    "SLURM_JOB_NAME",
    "OMPI_COMM_WORLD_SIZE",
    "PMI_SIZE",
    "LSB_JOBID",
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "ACCELERATE_USE_CPU",
    "ACCELERATE_MIXED_PRECISION",
    # Some sandboxes set it; a user's Python writes and reuses bytecode (see compile_bytecode).
    "PYTHONDONTWRITEBYTECODE",
    "PYTHONPYCACHEPREFIX",
)


@dataclass(frozen=True)
class Variant:
    """One way of doing the same work: a command line plus settings merged into the case's config.

    ``source``: the drivetrain tree the variant measures (put first on ``PYTHONPATH`` and checked
    against the module the sample imported); None for variants without drivetrain.
    """

    name: str
    label: str
    command: tuple[str, ...]
    config: Mapping[str, Any] = field(default_factory=dict)
    env: Mapping[str, str] = field(default_factory=dict)
    source: Source | None = None

    def from_source(self, source: Source) -> Variant:
        """This variant measuring ``source``: its name and label say which tree (``@before``)."""
        return replace(
            self, name=self.name + source.suffix, label=self.label + source.label_suffix, source=source
        )


@dataclass
class Sample:
    """What one process reported (``result``), or why it reported nothing (``error``)."""

    variant: str
    round: int
    wall_s: float
    result: dict[str, Any] | None = None
    error: str | None = None

    def get(self, key: str) -> Any:
        return None if self.result is None else self.result.get(key)


def parse_result(output: str) -> dict[str, Any] | None:
    """The last ``BENCH_RESULT`` line of a process's output, decoded; None if there is none."""
    found = None
    for line in output.splitlines():
        if line.startswith(RESULT_PREFIX):
            found = json.loads(line[len(RESULT_PREFIX) :])
    return found


def base_environment(threads: int) -> dict[str, str]:
    """The environment every sample starts from: ours, scrubbed, with the repo importable."""
    env = {k: v for k, v in os.environ.items() if k not in _SCRUBBED}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
    env["OMP_NUM_THREADS"] = str(threads)
    env["MKL_NUM_THREADS"] = str(threads)
    # Peers print banners and deprecation notes; they cost nothing per step, but keep logs short.
    env.setdefault("PYTHONWARNINGS", "ignore")
    return env


class Runner:
    """Starts samples and keeps the log of what happened.

    Args:
        threads: ``OMP_NUM_THREADS`` for every process the samples start.
        timeout_s: a sample still running after this long is killed (its whole process group).
        log: where progress lines go.
    """

    def __init__(
        self,
        *,
        threads: int,
        timeout_s: float = 300.0,
        log: Callable[[str], None] = print,
        deadline: float | None = None,
    ) -> None:
        self.env = base_environment(threads)
        self.timeout_s = timeout_s
        self.log = log
        # time.monotonic() after which no new sample starts (a device lease, say, is about to end).
        self.deadline = deadline
        self._workdir = tempfile.TemporaryDirectory(prefix="drivetrain-bench-")

    def close(self) -> None:
        self._workdir.cleanup()

    def run_once(self, variant: Variant, config: Mapping[str, Any], round_index: int = 0) -> Sample:
        timeout = self.timeout_s
        if self.deadline is not None:
            left = self.deadline - time.monotonic()
            if left < 5:
                return Sample(
                    variant.name, round_index, 0.0, error="not run: the run's --time-limit was reached"
                )
            timeout = min(timeout, left)
        env = dict(self.env)
        env.update(variant.env)
        if variant.source is not None:
            env["PYTHONPATH"] = os.pathsep.join([str(variant.source.path), env["PYTHONPATH"]])
        env[CONFIG_VARIABLE] = json.dumps({**config, **variant.config})
        # The samples run in a scratch directory: frameworks that write logs or configs to the
        # working directory must not litter the repository.
        env[START_VARIABLE] = repr(time.time())
        started = time.perf_counter()
        process = subprocess.Popen(
            variant.command,
            cwd=self._workdir.name,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        try:
            stdout, stderr = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_group(process)
            stdout, stderr = process.communicate()
            wall = time.perf_counter() - started
            return Sample(variant.name, round_index, wall, error=f"timed out after {timeout:.0f} s")
        except BaseException:
            # Interrupted (Ctrl-C, SIGTERM turned into an exception): the sample runs in its own
            # session and would outlive us.
            _kill_group(process)
            raise
        wall = time.perf_counter() - started
        result = parse_result(stdout)
        if process.returncode != 0 or result is None:
            reason = f"exit code {process.returncode}" if process.returncode else "no BENCH_RESULT line"
            lines = (stdout + stderr).strip().splitlines()
            # First line: the reason and the last line printed (usually the exception); then context.
            last = lines[-1].strip() if lines else ""
            tail = "\n".join(lines[-12:])
            return Sample(variant.name, round_index, wall, error=f"{reason}: {last}\n{tail}")
        if variant.source is not None and not variant.source.owns(result.get("drivetrain_file")):
            return Sample(
                variant.name,
                round_index,
                wall,
                error=(
                    f"imported drivetrain from {result.get('drivetrain_file')}, not from {variant.source.path}: "
                    f"another drivetrain shadows the tree under test (check PYTHONPATH and .pth files of "
                    f"{variant.command[0]})"
                ),
            )
        return Sample(variant.name, round_index, wall, result=result)

    def interleave(
        self,
        variants: Sequence[Variant],
        config: Mapping[str, Any],
        *,
        rounds: int,
        warmup_rounds: int = 0,
        rounds_of: Mapping[str, int] | None = None,
        min_rounds: int | None = None,
        enough: Callable[[dict[str, list[Sample]]], bool] | None = None,
    ) -> dict[str, list[Sample]]:
        """Run every variant once per round, round after round; warm-up rounds are discarded.

        A variant that fails is not run again (its error is kept as its only sample), so one broken
        variant costs one process, not one per round.

        Args:
            rounds_of: variant name -> the number of rounds it takes part in (the first ones), for
                variants that need fewer rounds than the others; the rest run ``rounds``.
            min_rounds, enough: with both, stop after any round from ``min_rounds`` on at which
                ``enough(samples so far)`` holds (the rounds are then "up to ``rounds``").
        """
        samples: dict[str, list[Sample]] = {v.name: [] for v in variants}
        failed: set[str] = set()
        limits = rounds_of or {}
        for round_index in range(warmup_rounds + rounds):
            warm = round_index < warmup_rounds
            measured = round_index - warmup_rounds
            for variant in variants:
                if variant.name in failed or (not warm and measured >= limits.get(variant.name, rounds)):
                    continue
                sample = self.run_once(variant, config, measured)
                status = "ok" if sample.error is None else "FAILED"
                self.log(
                    f"  {'warm-up' if warm else f'round {measured + 1}/{rounds}'}"
                    f" {variant.name}: {status} ({sample.wall_s:.1f} s)"
                )
                if sample.error is not None:
                    failed.add(variant.name)
                    samples[variant.name] = [sample]
                    self.log("    " + sample.error.replace("\n", "\n    "))
                elif not warm:
                    samples[variant.name].append(sample)
            done = measured + 1
            if (
                not warm
                and min_rounds is not None
                and enough is not None
                and min_rounds <= done < rounds
                and enough(samples)
            ):
                self.log(f"  precise enough after {done} rounds")
                break
        return samples


def compile_bytecode(
    python: str, paths: Sequence[Path], log: Callable[[str], None] = print, installed: bool = False
) -> str | None:
    """Write the bytecode of ``paths`` (drivetrain trees, this package) once, before any case runs.

    An installed package comes with its ``.pyc`` files (pip compiles at install), and a user's
    Python writes them for a source checkout on the first import; from then on no import
    compiles. Measured without them, every sample of a drivetrain variant would compile the
    whole package again (~80 ms, half of drivetrain's import time) while the peers' installed
    packages would not: a cost no user pays after their first run. With ``installed``, the
    interpreter's installed packages too (files already compiled are skipped): an environment
    ``scripts/test`` built compiles on import only what the tests imported, and the first sample
    to import anything else would pay for it. Returns an error message, or None when the
    bytecode was written.
    """
    env = base_environment(1)
    if installed:
        found = subprocess.run(
            [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        if found.returncode != 0 or not found.stdout.strip():
            return f"could not find the installed packages of {python}: {found.stderr.strip()[-300:]}"
        paths = [*paths, Path(found.stdout.strip())]
    command = [python, "-m", "compileall", "-q", "-j", "0", *map(str, paths)]
    try:
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300, check=False)
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"could not compile the bytecode of {', '.join(map(str, paths))}: {error}"
    if done.returncode != 0:
        tail = (done.stdout + done.stderr).strip().splitlines()[-3:]
        return f"compileall failed (exit code {done.returncode}) for {', '.join(map(str, paths))}: {' / '.join(tail)}"
    log(f"bytecode written for {', '.join(map(str, paths))}")
    return None


def _kill_group(process: subprocess.Popen) -> None:
    # The sample was started in its own session, so its group holds exactly the processes it
    # started (launchers' ranks included) and nothing else.
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


@dataclass
class Context:
    """What every case needs to know about this run.

    Attributes:
        quick: fewer rounds and steps (a smoke run of the whole suite in under two minutes).
        python: the project's interpreter (raw PyTorch and drivetrain variants).
        peers_python: the peers' interpreter (Lightning, Fabric, Accelerate), or None to leave them out.
        gpu_dry_run: run the GPU case's scripts on the CPU with a tiny model (checks, no numbers).
        only: run just these variant names (plus each case's reference); None runs all.
        deadline: ``time.monotonic()`` after which no new sample starts (``--time-limit``).
        sources: the drivetrain trees to measure (``--drivetrain-src``); the first is the baseline.
        rounds: fresh-process rounds per case instead of each case's default (``--rounds``).
    """

    quick: bool
    python: str
    peers_python: str | None
    gpu_dry_run: bool = False
    only: frozenset[str] | None = None
    deadline: float | None = None
    log: Callable[[str], None] = print
    sources: tuple[Source, ...] = field(default_factory=lambda: (default_source(),))
    rounds: int | None = None

    def per_source(self, variant: Variant) -> list[Variant]:
        """One copy of a drivetrain variant per source tree (named ``name@source`` when several)."""
        return [variant.from_source(source) for source in self.sources]

    def select(self, variants: Sequence[Variant], *references: str) -> list[Variant]:
        """The variants ``--only`` names (all without it); references always stay, to compare with."""
        if self.only is None:
            return list(variants)
        return [
            v
            for v in variants
            if v.name in self.only or v.name.split("@")[0] in self.only or v.name in references
        ]

    @property
    def cores(self) -> int:
        return os.cpu_count() or 1

    def runner(self, threads: int, timeout_s: float = 300.0) -> Runner:
        return Runner(threads=threads, timeout_s=timeout_s, log=self.log, deadline=self.deadline)
