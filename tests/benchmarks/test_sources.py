"""``--drivetrain-src``: parsing, variant naming, and the check that a sample imported the right tree."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from benchmarks.harness import Runner, Variant
from benchmarks.sources import REPO_ROOT, Source, SourceError, default_source, parse_sources, trees_that_moved


def _tree(root: Path, name: str) -> Path:
    package = root / name / "src" / "drivetrain"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    return package.parent


def test_no_option_means_this_checkout(tmp_path: Path) -> None:
    assert parse_sources(None) == (default_source(),)
    assert default_source().path == REPO_ROOT / "src"


def test_named_trees_in_order(tmp_path: Path) -> None:
    before, after = _tree(tmp_path, "before"), _tree(tmp_path, "after")
    sources = parse_sources([f"before={before}", f"after={after}"])
    assert [s.name for s in sources] == ["before", "after"]
    assert sources[0].path == before.resolve()
    variant = Variant("drivetrain_trainer", "drivetrain Trainer", ("python",)).from_source(sources[1])
    assert (variant.name, variant.label, variant.source) == (
        "drivetrain_trainer@after",
        "drivetrain Trainer [after]",
        sources[1],
    )


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("/some/path", "expected NAME=PATH"),
        ("=/some/path", "expected NAME=PATH"),
        ("bad name={tree}", "must start with a letter or digit"),
        ("x={root}/before", "did you mean"),
        ("x={root}/nothing", "does not contain drivetrain/__init__.py"),
    ],
)
def test_bad_values_say_what_to_pass(tmp_path: Path, value: str, message: str) -> None:
    tree = _tree(tmp_path, "before")
    with pytest.raises(SourceError, match=message):
        parse_sources([value.format(tree=tree, root=tmp_path)])


def test_a_name_or_a_tree_given_twice_is_refused(tmp_path: Path) -> None:
    one, two = _tree(tmp_path, "one"), _tree(tmp_path, "two")
    with pytest.raises(SourceError, match="given twice"):
        parse_sources([f"a={one}", f"a={two}"])
    with pytest.raises(SourceError, match="already measured under another name"):
        parse_sources([f"a={one}", f"b={one}"])


REPORT_DRIVETRAIN = (
    "import drivetrain, json, os; "
    "print('BENCH_RESULT ' + json.dumps({'drivetrain_file': drivetrain.__file__, "
    "'path': os.environ['PYTHONPATH']}))"
)


def test_a_sample_imports_drivetrain_from_its_tree(tmp_path: Path) -> None:
    tree = _tree(tmp_path, "other")
    source = Source("other", tree)
    runner = Runner(threads=1)
    try:
        sample = runner.run_once(
            Variant("v", "v", (sys.executable, "-c", REPORT_DRIVETRAIN), source=source), {}
        )
    finally:
        runner.close()
    assert sample.error is None, sample.error
    assert sample.result["drivetrain_file"] == str(tree / "drivetrain" / "__init__.py")
    assert sample.result["path"].split(":")[0] == str(tree)


def test_a_sample_that_imported_another_drivetrain_is_refused(tmp_path: Path) -> None:
    tree = _tree(tmp_path, "wanted")
    elsewhere = _tree(tmp_path, "elsewhere")
    # The variant's own settings put another tree first, as a stray .pth or PYTHONPATH entry would.
    shadowing = f"import sys; sys.path.insert(0, {str(elsewhere)!r}); " + REPORT_DRIVETRAIN
    runner = Runner(threads=1)
    try:
        sample = runner.run_once(
            Variant("v", "v", (sys.executable, "-c", shadowing), source=Source("w", tree)), {}
        )
    finally:
        runner.close()
    assert sample.result is None
    assert sample.error.startswith(
        f"imported drivetrain from {elsewhere / 'drivetrain' / '__init__.py'}, not from {tree}"
    )


def _git(repo: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=repo, check=True, capture_output=True
    )


def test_a_tree_that_changes_during_the_run_is_called_out(tmp_path: Path) -> None:
    src = _tree(tmp_path, "checkout")
    repo = src.parent
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "one")
    source = Source("after", src)
    at_start = {"after": source.describe()}
    assert at_start["after"]["commit"] is not None
    assert trees_that_moved(at_start, [source]) == []
    (src / "drivetrain" / "more.py").write_text("")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "landed meanwhile")
    [warning] = trees_that_moved(at_start, [source])
    assert warning.startswith("drivetrain tree 'after' changed during the run")
