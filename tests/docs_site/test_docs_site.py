"""The docs site: it builds strictly, its API reference is complete, and its guides' code runs.

The conventions the code-block test follows are documented for writers in docs/writing-docs.md.
"""

from __future__ import annotations

import importlib
import os
import re
import sys
from pathlib import Path

import pytest

from docs_site.code_blocks import code_blocks, page_program, write_page_files
from helpers.scripts import REPO, clean_env, run_command, run_script

DOCS = REPO / "docs"
GUIDES = sorted(p for p in DOCS.rglob("*.md") if p.parent.name != "api")
RUNNABLE = [p for p in GUIDES if any(b.runs for b in code_blocks(p.read_text(), str(p)))]
#: Pages whose program starts several processes.
MULTIPROCESS_PAGES = {"launching.md", "sharded-training.md"}
#: The API reference's pages and the package each documents.
API_PAGES = {
    "drivetrain": "drivetrain",
    "trainer": "drivetrain.trainer",
    "callbacks": "drivetrain.trainer.callbacks",
    "loggers": "drivetrain.loggers",
    "strategies": "drivetrain.strategies",
    "accelerators": "drivetrain.accelerators",
    "plugins": "drivetrain.plugins",
    "utils": "drivetrain.utils",
    "cli": "drivetrain.cli",
    "testing": "drivetrain.testing",
}
#: What each API page must show first: the package's main class before its helpers.
FIRST_ON_PAGE = {
    "drivetrain": "Trainer",
    "trainer": "Trainer",
    "callbacks": "Callback",
    "loggers": "Logger",
    "strategies": "Strategy",
    "accelerators": "Accelerator",
    "plugins": "Precision",
    "utils": "DataLoaderConfiguration",
    "cli": "CLI",
    "testing": "check_accelerator",
}
#: Sphinx roles and doctest markers, which Markdown would show as they are.
RAW_MARKUP = re.compile(
    r":(?:class|meth|func|attr|mod|data|exc|obj|const):`|doctest:|&gt;&gt;&gt;|(?<![\w-])::\s*</p>"
)


def _page_env() -> dict[str, str]:
    """A plain single-process environment with this checkout's drivetrain first on the path."""
    path = os.pathsep.join(filter(None, [str(REPO / "src"), os.environ.get("PYTHONPATH", "")]))
    return clean_env(
        PYTHONPATH=path, OMP_NUM_THREADS="1", MPLBACKEND="Agg", WANDB_MODE="offline", NO_MKDOCS_2_WARNING="1"
    )


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site built with ``mkdocs build --strict`` (any warning fails it)."""
    site_dir = tmp_path_factory.mktemp("site")
    result = run_command(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--clean", "--site-dir", str(site_dir)],
        cwd=REPO,
        env=_page_env(),
        timeout=400,
    )
    assert result.returncode == 0, f"mkdocs build --strict failed:\n{result.stdout}\n{result.stderr}"
    return site_dir


@pytest.mark.timeout(450)
def test_the_site_builds_strictly_with_every_page(site: Path) -> None:
    home = (site / "index.html").read_text()
    assert "The Trainer in twenty lines" in home and "Accelerator" in home
    for guide in GUIDES:
        relative = guide.relative_to(DOCS)
        built = site / (
            "index.html" if relative.name == "index.md" else relative.with_suffix("") / "index.html"
        )
        assert built.is_file(), f"{relative} was not built into {built}"
    # Nothing on the site points outside it except the project pages the guides cite on purpose.
    assert "fonts.googleapis.com" not in home


@pytest.mark.timeout(450)
@pytest.mark.parametrize("page", sorted(API_PAGES))
def test_the_api_reference_documents_every_exported_name(site: Path, page: str) -> None:
    package = API_PAGES[page]
    html = (site / "api" / page / "index.html").read_text()
    exported = sorted(set(importlib.import_module(package).__all__) - {"__version__"})
    anchors = set(re.findall(r'id="([^"]+)"', html))
    missing = [name for name in exported if f"{package}.{name}" not in anchors]
    assert not missing, f"docs/api/{page}.md does not document {missing} (exported by {package}.__all__)"
    # The docstrings are rendered, not only the names.
    assert html.count('class="doc doc-contents') >= len(exported)


def _text(html: str) -> str:
    """The page's visible text: tags dropped (code keeps its characters), entities left as they are."""
    return re.sub(r"<[^>]+>", "", html)


@pytest.mark.timeout(450)
@pytest.mark.parametrize("page", [*sorted(API_PAGES), "lightning_names"])
def test_the_api_reference_renders_docstrings_as_markdown(site: Path, page: str) -> None:
    html = (site / "api" / page / "index.html").read_text()
    body = html[html.index("<article") : html.index("</article>")]
    raw = sorted({m.group(0) for m in RAW_MARKUP.finditer(body)})
    assert not raw, f"docs/api/{page}: reStructuredText or doctest markup shown as text: {raw}"
    # No "| | |" quote bars: doctest lines became code, not nested block quotes.
    assert "<blockquote>" not in body
    if page in FIRST_ON_PAGE:
        package = API_PAGES[page]
        headings = re.findall(r'<h2 id="([^"]+)" class="doc doc-heading"', body)
        assert headings and headings[0] == f"{package}.{FIRST_ON_PAGE[page]}", headings[:3]


@pytest.mark.timeout(450)
def test_the_api_reference_links_examples_tables_and_signatures(site: Path) -> None:
    html = (site / "api" / "drivetrain" / "index.html").read_text()
    accelerator = html[html.index('id="drivetrain.Accelerator"') :]
    accelerator = accelerator[: accelerator.index('class="doc doc-children"')]
    # Every constructor argument is a row of the parameter table (Accelerate's and drivetrain's).
    parameters = re.findall(r"<td>\s*<code>(\w+)</code>\s*</td>", accelerator)
    for name in (
        "device_placement",
        "mixed_precision",
        "project_dir",
        "dispatch_batches",
        "strategy",
        "plugins",
    ):
        assert name in parameters, name
    # Sphinx roles became links to the documented objects.
    assert re.search(
        r'<a class="autorefs autorefs-internal"[^>]*href="[^"]*#drivetrain.connect"', accelerator
    )
    # Examples are code blocks, without the doctest prompts and directives.
    callbacks = (site / "api" / "callbacks" / "index.html").read_text()
    blocks = [_text(b) for b in re.findall(r'<div class="[^"]*highlight"><pre>(.*?)</pre>', callbacks, re.S)]
    assert any("trainer = Trainer(callbacks=[BatchSizeFinder(" in block for block in blocks)
    assert "doctest" not in callbacks
    # Signatures are formatted on their own lines (one argument per line for a long one).
    trainer = html[html.index('id="drivetrain.Trainer"') :]
    signature = trainer[trainer.index('class="doc-signature') :][:20000]
    signature = _text(signature[: signature.index("</code>")])
    assert "\n    accelerator" in signature and "\n    strategy" in signature, signature[:300]


def test_the_home_page_lists_every_extra() -> None:
    tomllib = pytest.importorskip("tomllib")
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    table = [line for line in (DOCS / "index.md").read_text().splitlines() if line.startswith("| `")]
    listed = {name for line in table for name in re.findall(r"`([\w-]+)`", line.split("|")[1])}
    missing = sorted(set(extras) - {"dev"} - listed)
    assert not missing, f"docs/index.md's table of extras does not list {missing} (pyproject.toml has them)"


def test_the_demo_installs_the_extras_the_guides_use() -> None:
    """scripts/demo is a newcomer's first step; the guides they read next use the plot, cli, rich … extras."""
    demo = (REPO / "scripts" / "demo").read_text()
    (bootstrap,) = [
        line for line in demo.splitlines() if "scripts/bootstrap" in line and not line.startswith("#")
    ]
    assert {"examples", "all"} <= set(bootstrap.split()), bootstrap
    # Each run writes into a folder of its own, named when it starts (not one folder shared by everyone).
    assert "mktemp -d" in demo and "--root" in demo


def test_code_blocks_are_found_as_documented() -> None:
    page = "\n".join(
        [
            "# A page",
            "```python",
            "x = 1",
            "```",
            "<!-- skip -->",
            "",
            "```python",
            "cluster_only()",
            "```",
            '```python title="train.py"',
            "print('a file')",
            "```",
            "```bash",
            "python train.py",
            "```",
            "````python",
            "assert x == 1",
            "```",
            "````",
        ]
    )
    blocks = code_blocks(page)
    assert [(b.language, b.title, b.line, b.runs, b.is_file) for b in blocks] == [
        ("python", None, 3, True, False),
        ("python", None, 8, False, False),
        ("python", "train.py", 11, False, True),
        ("bash", None, 14, False, False),
        ("python", None, 17, True, False),
    ]
    program = page_program(blocks).splitlines()
    assert program[2] == "x = 1" and program[16] == "assert x == 1" and program[17] == "```"
    with pytest.raises(ValueError, match=r"<page>:2: the code block opened here is never closed"):
        code_blocks("text\n```python\nx = 1\n")


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    "page",
    [
        pytest.param(
            p, id=str(p.relative_to(DOCS)), marks=[pytest.mark.multiprocess] * (p.name in MULTIPROCESS_PAGES)
        )
        for p in RUNNABLE
    ],
)
def test_a_guides_code_runs(page: Path, tmp_path: Path) -> None:
    """The page's python blocks run in order as one program, in an empty folder with the page's files."""
    blocks = code_blocks(page.read_text(), str(page))
    write_page_files(blocks, tmp_path)
    program = tmp_path / f"{page.stem.replace('-', '_')}_page.py"
    program.write_text(page_program(blocks))
    result = run_script([str(program)], cwd=tmp_path, env=_page_env(), timeout=240)
    assert result.returncode == 0, (
        f"the code of {page.relative_to(REPO)} failed (line numbers in the traceback are the page's; a block "
        f"not meant to run gets a '<!-- skip -->' line before it, see docs/writing-docs.md):\n"
        f"--- stdout ---\n{result.stdout}\n--- stderr ---\n{result.stderr}"
    )
