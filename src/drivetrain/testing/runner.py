"""Starting the kit's programs: one process, ``drivetrain launch -n N``, the CLI, or the kit as a scheduler.

Every program runs in a fresh process group with a hard time limit (a hang is killed, and
reported as one), with this process's import path (so a plugin importable here is importable
there), without the launcher variables of whatever started the kit, and with one CPU thread per
process. The settings reach the programs through ``DRIVETRAIN_KIT_SETTINGS``.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from drivetrain.testing.settings import SETTINGS_VARIABLE, ProgramSettings

_LAUNCHER_PREFIXES = (
    "SLURM_",
    "OMPI_",
    "PMI_",
    "PMIX_",
    "LSB_",
    "JSM_",
    "TORCHELASTIC_",
    "DRIVETRAIN_",
    "ACCELERATE_",
)
_LAUNCHER_NAMES = {
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "NODE_RANK",
    "GROUP_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "KUBERNETES_PORT",
    "MPI_LOCALRANKID",
}
_ERROR_LINE = re.compile(r"^[\w.]*(Error|Exception|Exit|Interrupt|Failed)\b.*")
_PROGRAM = "from drivetrain.testing.program import main\n\nmain()\n"
_CLI_PROGRAM = """\
from drivetrain.testing.program import KitData, KitModule, cli_report, cli_run

run = cli_run()  # the plugin in place first: it registers the names the command line uses

from drivetrain.cli import CLI

cli = CLI(KitModule, KitData, save_config_callback=None, seed_everything_default=0)
cli_report(run, cli.trainer)
"""


@dataclass
class ProgramRun:
    """How one program ended."""

    command: str
    returncode: int | None
    output: str
    timed_out: bool = False

    def tail(self, lines: int = 12) -> str:
        """The last lines of what the program printed (its error, mostly)."""
        kept = [line for line in self.output.splitlines() if line.strip()]
        return "\n".join(kept[-lines:])

    def last_error(self) -> str:
        """The last line that looks like an exception (``ValueError: ...``), for one-line reasons."""
        for line in reversed(self.output.splitlines()):
            if _ERROR_LINE.match(line.strip()):
                return line.strip()[:800]
        return self.tail(1)[:800]


def environment(settings_path: Path, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment for a program: launcher variables dropped, the kit's settings and path added."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in _LAUNCHER_NAMES and not k.startswith(_LAUNCHER_PREFIXES)
    }
    paths = [p for p in sys.path if p and os.path.isdir(p)]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    env[SETTINGS_VARIABLE] = str(settings_path)
    env["PYTHONUNBUFFERED"] = "1"
    env["OMP_NUM_THREADS"] = "1"
    env.update(extra or {})
    return env


def write_programs(root: Path) -> tuple[Path, Path]:
    """The two scripts the kit runs (the phases' program and the CLI's ``train.py``)."""
    root.mkdir(parents=True, exist_ok=True)
    program, cli = root / "kit_program.py", root / "train.py"
    program.write_text(_PROGRAM)
    cli.write_text(_CLI_PROGRAM)
    return program, cli


def run(command: Sequence[str], env: Mapping[str, str], cwd: Path, timeout: float) -> ProgramRun:
    """Run ``command``; on timeout kill its whole process group."""
    process = subprocess.Popen(
        list(command),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=dict(env),
        cwd=cwd,
        start_new_session=True,
    )
    try:
        output, _ = process.communicate(timeout=timeout)
        return ProgramRun(" ".join(command), process.returncode, output)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        return ProgramRun(" ".join(command), None, output, timed_out=True)


def run_phase(
    settings: ProgramSettings,
    settings_path: Path,
    phase: str,
    timeout: float,
    launch_accelerator: str | None = None,
    variables: Mapping[str, str] | None = None,
) -> ProgramRun:
    """Run one phase of the programs: one ``python`` process (which may start the others itself, through the
    front doors' own launcher), or ``drivetrain launch -n N`` when the settings say the processes are launched."""
    program = Path(settings.root) / "kit_program.py"
    env = environment(settings_path, variables)
    if not settings.launched:
        return run([sys.executable, str(program), phase], env, Path(settings.root), timeout)
    command = [sys.executable, "-m", "drivetrain", "launch", "-n", str(settings.devices)]
    if launch_accelerator:
        command += ["--accelerator", launch_accelerator]
    return run([*command, str(program), phase], env, Path(settings.root), timeout)


def run_scheduled(
    settings: ProgramSettings,
    settings_path: Path,
    phase: str,
    timeout: float,
    rank_environment: Sequence[Mapping[str, str]],
) -> ProgramRun:
    """Start one process per entry of ``rank_environment`` as a scheduler would (each with its variables).

    When one ends with an error (or is killed), the others are ended too, as a scheduler ends a job.
    """
    program = Path(settings.root) / "kit_program.py"
    processes = [
        subprocess.Popen(
            [sys.executable, str(program), phase],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=environment(settings_path, variables),
            cwd=settings.root,
            start_new_session=True,
        )
        for variables in rank_environment
    ]
    deadline = time.monotonic() + timeout
    timed_out = False
    while any(p.poll() is None for p in processes):
        if any(p.returncode not in (None, 0) for p in processes) or time.monotonic() > deadline:
            timed_out = time.monotonic() > deadline
            for p in processes:
                if p.poll() is None:
                    os.killpg(p.pid, signal.SIGKILL)
            break
        time.sleep(0.05)
    outputs = [p.communicate()[0] for p in processes]
    failed = [p.returncode for p in processes if p.returncode != 0]
    return ProgramRun(
        f"{len(processes)} x {sys.executable} {program} {phase} (started as the cluster's scheduler would)",
        failed[0] if failed else 0,
        "\n".join(f"--- rank {r} ---\n{out}" for r, out in enumerate(outputs)),
        timed_out=timed_out,
    )


def run_cli(
    settings: ProgramSettings, settings_path: Path, arguments: Sequence[str], timeout: float
) -> ProgramRun:
    """``python train.py fit <arguments>`` in the run's folder."""
    script = Path(settings.root) / "train.py"
    return run(
        [sys.executable, str(script), "fit", *arguments],
        environment(settings_path),
        Path(settings.root),
        timeout,
    )


def free_port() -> int:
    """A TCP port nobody listens on now (for the kit acting as a scheduler)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])
