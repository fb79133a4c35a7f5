"""The ``drivetrain`` command as its console script runs it: quick to answer, and finding the user's code.

The console script does not put the current folder on ``sys.path`` (``python -P`` runs the same
way), so these run the command in a subprocess like that.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from helpers.scripts import clean_env, run_command

COMMAND = "import sys; from drivetrain.cli.main import main; sys.exit(main())"
PROBE = """
import contextlib, io, json, sys
from drivetrain.cli.main import main
with contextlib.redirect_stdout(io.StringIO()) as out, contextlib.suppress(SystemExit):
    main(sys.argv[1:])
print(json.dumps({"torch": "torch" in sys.modules, "printed": out.getvalue()}))
"""


@pytest.mark.parametrize("arguments", [["--help"], ["--version"], ["launch", "--help"], ["config", "--help"]])
def test_help_and_version_do_not_import_torch(arguments: list[str]) -> None:
    completed = run_command([sys.executable, "-P", "-c", PROBE, *arguments], timeout=60)
    assert completed.returncode == 0, completed.stderr
    answer = json.loads(completed.stdout.splitlines()[-1])
    assert answer["printed"] and not answer["torch"]


MODEL = """
from torch import nn

from blocks import Block


class GPT2(nn.Module):
    def __init__(self, width: int = 64, layers: int = 2) -> None:
        super().__init__()
        self.blocks = nn.Sequential(*(Block(width) for _ in range(layers)))
"""
BLOCKS = """
from torch import nn


class Block(nn.Linear):
    def __init__(self, width: int) -> None:
        super().__init__(width, width)
"""


def test_estimate_memory_imports_from_the_current_folder_and_from_a_file_path(tmp_path: Path) -> None:
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "gpt2_model.py").write_text(MODEL)
    (folder / "blocks.py").write_text(BLOCKS)
    parameters = 2 * (64 * 64 + 64)
    for cwd, spec in (
        (folder, "gpt2_model:GPT2"),  # a module of the current folder
        (folder, "./gpt2_model.py:GPT2"),  # a file path
        (tmp_path, "project/gpt2_model.py:GPT2"),  # a file elsewhere, importing its neighbour
    ):
        completed = run_command(
            [sys.executable, "-P", "-c", COMMAND, "estimate-memory", spec, "--json"],
            env=clean_env(),
            cwd=cwd,
            timeout=120,
        )
        assert completed.returncode == 0, f"{spec}: {completed.stderr}"
        rows = json.loads(completed.stdout)
        weights = {
            r["weights"] for r in rows if (r["strategy"], r["precision"]) == ("single_device", "32-true")
        }
        assert weights == {4 * parameters}, spec
