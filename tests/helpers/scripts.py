"""Run a Python script (or the ``drivetrain`` command) in a subprocess with a hard timeout."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without any launcher/cluster variables, plus ``extra``."""
    launcher_prefixes = ("SLURM_", "OMPI_", "PMI_", "PMIX_", "LSB_", "JSM_", "TORCHELASTIC_", "DRIVETRAIN_")
    launcher_names = {
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
    env = {
        k: v for k, v in os.environ.items() if k not in launcher_names and not k.startswith(launcher_prefixes)
    }
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def run_script(
    args: list[str],
    *,
    timeout: float = 120,
    env: dict[str, str] | None = None,
    cwd: str | Path | None = None,
    stdin: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``python <args>``; on timeout the whole process group is killed and the test fails with the output.

    ``stdin`` is written to the program's standard input (the lines of a ``python -i`` session, say).
    """
    return run_command([sys.executable, *args], timeout=timeout, env=env, cwd=cwd, stdin=stdin)


def run_command(
    command: list[str],
    *,
    timeout: float = 120,
    env: dict[str, str] | None = None,
    cwd: str | Path | None = None,
    stdin: str | None = None,
) -> subprocess.CompletedProcess[str]:
    process = subprocess.Popen(
        command,
        stdin=subprocess.PIPE if stdin is not None else None,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env if env is not None else clean_env(),
        cwd=cwd,
        start_new_session=True,
    )
    try:
        stdout, stderr = process.communicate(input=stdin, timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, 9)
        stdout, stderr = process.communicate()
        raise AssertionError(
            f"{' '.join(command)} did not finish within {timeout:.0f} s.\n--- stdout ---\n{stdout}\n--- stderr ---\n{stderr}"
        ) from None
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)
