"""House rules checked mechanically: imports flow one way, and `import drivetrain` stays lazy.

The layers of DESIGN.md, lowest first. A module may import from its own package and from lower
layers only; packages that share a layer are independent of each other (the two front doors do
not use each other, nor do the data layer and the loggers). Every import counts: at module level,
inside functions, under ``TYPE_CHECKING``, and the module names given to ``importlib`` as strings
(lazy names, registries of built-in modules).
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

SOURCE = Path(__file__).resolve().parents[1] / "src" / "drivetrain"

LAYERS: list[set[str]] = [
    {"_utilities"},
    {"logging"},  # drivetrain.logging: the public face of _utilities/log.py
    {"accelerators", "plugins"},
    {"strategies"},
    {"data", "loggers", "big_modeling", "profilers"},
    {"connector"},
    {"utils"},  # Accelerate's public helpers: below the façade, which uses them
    {"facade", "trainer"},  # the two front doors
    {"cli"},
    {
        "__main__",
        "lightning_names",
    },  # python -m drivetrain; Lightning's names for the door's and the CLI's classes
]
LAYER_OF = {package: level for level, packages in enumerate(LAYERS) for package in packages}

_MODULE_NAME = re.compile(r"drivetrain(\.[a-z_]+)+(:\w+)?")  # "module" or "module:attribute"


def _package(module: str) -> str | None:
    """The top-level package (or root module) of ``drivetrain`` that ``module`` belongs to."""
    parts = module.split(".")
    if parts[0] != "drivetrain" or len(parts) == 1:
        return None
    return parts[1]


def _imports(path: Path) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and _MODULE_NAME.fullmatch(node.value)
        ):
            found.append(
                (node.lineno, node.value.partition(":")[0])
            )  # import_module("drivetrain.x"), lazy maps
    return found


def _violations(source: Path) -> list[str]:
    violations = []
    for path in sorted(source.rglob("*.py")):
        relative = path.relative_to(source.parent).with_suffix("")
        module = ".".join(relative.parts).removesuffix(".__init__")
        own = _package(module)
        if own is None:
            continue  # the package root re-exports every layer, lazily
        for line, imported in _imports(path):
            target = _package(imported)
            if target is None or target == own or target not in LAYER_OF:
                continue
            if LAYER_OF[target] > LAYER_OF[own]:
                violations.append(
                    f"{path.relative_to(source.parent)}:{line} imports {imported} (a higher layer)"
                )
            elif LAYER_OF[target] == LAYER_OF[own]:
                violations.append(
                    f"{path.relative_to(source.parent)}:{line} imports {imported} ({own} and {target} are independent)"
                )
    return violations


def test_lower_layers_never_import_higher_ones_and_peers_stay_independent() -> None:
    violations = _violations(SOURCE)
    assert not violations, "imports against the layer order:\n" + "\n".join(violations)


def test_every_package_module_is_assigned_a_layer() -> None:
    unassigned = {p.relative_to(SOURCE).parts[0].removesuffix(".py") for p in SOURCE.rglob("*.py")} - set(
        LAYER_OF
    )
    assert unassigned <= {"__init__", "py"}, f"add these to LAYERS: {sorted(unassigned)}"


def test_the_contract_catches_what_it_forbids(tmp_path: Path) -> None:
    """The check itself: each kind of forbidden import in a small package tree is reported."""
    package = tmp_path / "drivetrain"
    files = {
        "trainer/loop.py": "from drivetrain.facade.accelerator import Accelerator\n",  # front door -> front door
        "utils/operations.py": "def gather():\n    from drivetrain.facade import current\n",  # lazy, upwards
        "data/loader.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import drivetrain.loggers\n",
        "strategies/registry.py": "BUILTIN = ('drivetrain.trainer.module',)\n",  # imported by name
        "facade/accelerator.py": "from drivetrain.utils import operations\nfrom drivetrain.trainer import x\n",
        "connector.py": "import drivetrain.strategies.ddp\n",  # allowed: downwards
    }
    for name, code in files.items():
        (package / name).parent.mkdir(parents=True, exist_ok=True)
        (package / name).write_text(code)
    found = sorted(line.split(" imports ")[0] for line in _violations(package))
    assert found == [
        "drivetrain/data/loader.py:3",
        "drivetrain/facade/accelerator.py:2",
        "drivetrain/strategies/registry.py:1",
        "drivetrain/trainer/loop.py:1",
        "drivetrain/utils/operations.py:2",
    ]


def test_import_drivetrain_imports_nothing_else_of_drivetrain() -> None:
    code = "import drivetrain, sys; print(sorted(m for m in sys.modules if m.startswith('drivetrain')))"
    output = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert output.strip() == "['drivetrain']"
