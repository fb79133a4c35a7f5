"""The kit's three front ends: the Report and its table, ``drivetrain check-plugin``, and the pytest plugin."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from drivetrain.testing import PluginCheckError, Report, Status
from drivetrain.testing.report import failed, not_applicable, passed
from helpers.scripts import REPO, clean_env, run_command

TESTS = REPO / "tests"


def _env() -> dict[str, str]:
    return clean_env(PYTHONPATH=os.pathsep.join([str(REPO / "src"), str(TESTS)]), OMP_NUM_THREADS="1")


def test_the_report_table_says_each_row_and_failures_name_their_fix() -> None:
    report = Report("MyAccelerator (xpu)", "accelerator")
    report.add(passed("accelerator: registered under a short name"))
    report.add(
        failed(
            "accelerator: random generators saved and restored",
            "get_rng_state() returns None.",
            "implement it.",
        )
    )
    report.add(not_applicable("2 processes: whole programs", "MyAccelerator offers 1 device(s) here"))
    table = report.table()
    assert table.splitlines()[0] == (
        "drivetrain plugin check: MyAccelerator (xpu) (accelerator): 1 passed, 1 failed, 1 not applicable"
    )
    assert "accelerator: registered under a short name" in table and "passed" in table
    assert "get_rng_state() returns None. Fix: implement it." in " ".join(table.split())
    assert "MyAccelerator offers 1 device(s) here" in " ".join(table.split())
    assert not report.ok and [r.status for r in report] == [
        Status.PASSED,
        Status.FAILED,
        Status.NOT_APPLICABLE,
    ]
    with pytest.raises(
        PluginCheckError,
        match=r"MyAccelerator \(xpu\) failed 1 of 3 checks:\n- accelerator: random generators saved and restored: "
        r"get_rng_state\(\) returns None\. Fix: implement it\.",
    ):
        report.raise_for_failures()
    with pytest.raises(KeyError, match="No row 'nope'"):
        report.row("nope")


def test_importing_the_kit_imports_neither_pytest_nor_its_machinery() -> None:
    code = (
        "import sys, drivetrain.testing as t; t.check_accelerator; "
        "print('pytest' in sys.modules, 'drivetrain.testing.program' in sys.modules)"
    )
    output = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=_env(), timeout=120
    )
    assert output.stdout.split() == ["False", "False"], output.stderr


def test_the_command_prints_the_table_and_exits_by_the_result() -> None:
    broken = run_command(
        [
            sys.executable,
            "-m",
            "drivetrain",
            "check-plugin",
            "testing.broken_plugins:KeyDroppingCheckpointIO",
            "--contract-only",
        ],
        env=_env(),
        timeout=120,
    )
    assert broken.returncode == 1, broken.stderr
    text = " ".join(broken.stdout.split())
    assert "drivetrain plugin check: KeyDroppingCheckpointIO (checkpoint_io): 6 passed, 1 failed" in text
    assert (
        "the loaded checkpoint lacks the key(s) 'rng'. Fix: write and read every key and value unchanged"
        in text
    )
    good = run_command(
        [sys.executable, "-m", "drivetrain", "check-plugin", "hpu", "--fake", "--contract-only"],
        env=_env(),
        timeout=120,
    )
    assert good.returncode == 0, good.stdout + good.stderr
    assert "HPUAccelerator (hpu) (accelerator): 11 passed, 0 failed" in good.stdout
    for arguments, message in (
        (
            ["nothing_here"],
            "'nothing_here' is neither an importable module nor a registered accelerator, strategy or precision",
        ),
        (
            ["testing.broken_plugins:WrongWorldSizeEnvironment"],
            "is a cluster environment: the kit needs every variable its scheduler sets and the environment "
            "reads (detect() and each getter), e.g. --env",
        ),
        (["drivetrain.plugins:LocalEnvironment", "--env", "RANK"], "--env takes NAME=VALUE, got 'RANK'"),
    ):
        refused = run_command(
            [sys.executable, "-m", "drivetrain", "check-plugin", *arguments], env=_env(), timeout=120
        )
        assert refused.returncode == 2 and message in refused.stderr, refused.stderr


_VENDOR = """
import torch
from drivetrain.plugins import ClusterEnvironment, TorchCheckpointIO


class PlainTorchIO(TorchCheckpointIO):
    pass


class MySchedEnvironment(ClusterEnvironment):
    creates_processes_externally = True
    main_address = "127.0.0.1"
    main_port = 0

    @staticmethod
    def detect():
        return False

    def world_size(self):
        return 1

    def set_world_size(self, size):
        pass

    def global_rank(self):
        return 0

    def set_global_rank(self, rank):
        pass

    def local_rank(self):
        return 0

    def node_rank(self):
        return 0
"""


def test_the_command_finds_a_plugin_being_written_here_and_explains_bad_targets(tmp_path: Path) -> None:
    """As a vendor runs it: the installed ``drivetrain`` command, in the folder that holds the plugin."""
    (tmp_path / "vendor.py").write_text(_VENDOR)
    command = str(Path(sys.executable).parent / "drivetrain")
    env = clean_env(PYTHONPATH=str(REPO / "src"), OMP_NUM_THREADS="1")

    def run(*arguments: str) -> subprocess.CompletedProcess[str]:
        return run_command([command, "check-plugin", *arguments], env=env, cwd=tmp_path, timeout=120)

    for target in (
        "vendor:PlainTorchIO",
        "vendor.py:PlainTorchIO",
        str(tmp_path / "vendor.py") + ":PlainTorchIO",
    ):
        checked = run(target, "--contract-only")
        assert checked.returncode == 0, checked.stdout + checked.stderr
        assert "PlainTorchIO (checkpoint_io): 7 passed, 0 failed" in checked.stdout
    # A module with an environment and no --env: the others are checked, the environment left out with why.
    module = run("vendor", "--contract-only")
    assert module.returncode == 0 and "PlainTorchIO (checkpoint_io): 7 passed" in module.stdout, module.stderr
    assert "Not checked: vendor:MySchedEnvironment is a cluster environment" in module.stderr
    for arguments, message in (
        (
            ["vendor:PlainTorchIo"],
            "vendor has no attribute 'PlainTorchIo' and registers no accelerator, "
            "strategy or precision of that name. Did you mean vendor:PlainTorchIO?",
        ),
        ([":PlainTorchIO"], "names no module before the colon: write module:Class"),
        (["nowhere:Thing"], f"No module named 'nowhere' here ({tmp_path}). Run the command from the folder"),
        (["plugins/notes.txt:Thing"], "plugins/notes.txt is not a Python file"),
        (
            ["vendor:MySchedEnvironment", "--env", "MYSCHED_WORLD={worldsize}"],
            "The variable MYSCHED_WORLD='{worldsize}' has a placeholder the kit does not fill ('worldsize'); "
            "use {rank}, {local_rank}, {node_rank}, {world_size}, {port}",
        ),
        (["vendor", "--processes", "3,x"], "argument --processes: process counts separated by commas"),
        (["vendor", "--world-size", "0"], "argument --world-size: a whole number of processes, at least 1"),
    ):
        refused = run(*arguments)
        assert refused.returncode == 2, (arguments, refused.stdout, refused.stderr)
        assert message in " ".join(refused.stderr.split()), (arguments, refused.stderr)
        assert "Traceback" not in refused.stderr, refused.stderr


def test_the_pytest_plugin_makes_one_test_per_target(tmp_path: Path) -> None:
    (tmp_path / "test_mine.py").write_text(
        textwrap.dedent(
            """
            from drivetrain.testing import check_checkpoint_io

            def test_with_the_fixture(drivetrain_check):
                report = drivetrain_check(check_checkpoint_io, "drivetrain.plugins:TorchCheckpointIO", whole_programs=False)
                assert report.row("checkpoint IO: a crash during save leaves the old or the new checkpoint").passed
            """
        )
    )
    command = [
        sys.executable,
        "-m",
        "pytest",
        "-p",
        "drivetrain.testing.pytest_plugin",
        "--drivetrain-plugin",
        "testing.broken_plugins:LenientCheckpointIO",
        "--drivetrain-plugin",
        "hpu",
        "--drivetrain-fake",
        "--drivetrain-contract-only",
        "-q",
        "-p",
        "no:cacheprovider",
        str(tmp_path),
    ]
    result = run_command(command, env=_env(), cwd=tmp_path, timeout=240)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "1 failed, 2 passed" in result.stdout, result.stdout
    assert "FAILED ::drivetrain-plugin[testing.broken_plugins:LenientCheckpointIO]" in result.stdout
    assert (
        "checkpoint IO: loading where nothing was saved is an error: load_checkpoint() of a path where nothing"
        in (" ".join(result.stdout.split()))
    )


def test_the_programs_of_a_plugin_other_processes_cannot_import_are_not_applicable_and_say_why(
    tmp_path: Path,
) -> None:
    from drivetrain.plugins import Precision, TorchCheckpointIO
    from drivetrain.testing import check_checkpoint_io, check_precision

    class LocalIO(TorchCheckpointIO):  # defined in a function: no other process can build it
        pass

    class LocalPrecision(Precision):
        pass

    io = check_checkpoint_io(LocalIO(), tmp_path / "io")
    assert io.ok and io.row("whole programs").status is Status.NOT_APPLICABLE
    assert "pass 'module:attribute' of LocalIO" in io.row("whole programs").reason
    precision = check_precision(LocalPrecision, root=tmp_path / "precision")
    assert precision.row("whole programs").status is Status.NOT_APPLICABLE
    assert "LocalPrecision cannot be imported by another process" in precision.row("whole programs").reason
    contract_only = check_checkpoint_io(LocalIO(), tmp_path / "contract", whole_programs=False)
    assert "whole_programs=False: the contract checks only." in contract_only.notes
    assert not [row for row in contract_only if row.name == "whole programs"]
