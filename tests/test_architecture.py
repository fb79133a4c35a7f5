"""House rules checked mechanically: imports flow one way, and `import drivetrain` stays lazy."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

SOURCE = Path(__file__).resolve().parents[1] / "src" / "drivetrain"

# DESIGN.md: utilities → accelerators, plugins → strategies (+ launchers) → connector → façade, trainer → cli
LAYERS = {
    "_utilities": 0,
    "accelerators": 1,
    "plugins": 1,
    "strategies": 2,
    "connector": 3,
    "data": 4,
    "loggers": 4,
    "facade": 4,
    "trainer": 4,
    "utils": 4,
    "cli": 5,
    "__main__": 5,
}


def _layer(module: str) -> int | None:
    parts = module.split(".")
    if parts[0] != "drivetrain":
        return None
    if len(parts) == 1:
        return max(LAYERS.values())  # the package root re-exports everything lazily
    return LAYERS.get(parts[1])


def _imports(path: Path) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
    return found


def test_lower_layers_never_import_higher_ones() -> None:
    violations = []
    for path in sorted(SOURCE.rglob("*.py")):
        relative = path.relative_to(SOURCE.parent).with_suffix("")
        module = ".".join(relative.parts).removesuffix(".__init__")
        own = _layer(module)
        if own is None or module == "drivetrain":
            continue
        for line, imported in _imports(path):
            target = _layer(imported)
            if target is not None and target > own:
                violations.append(f"{path.relative_to(SOURCE.parent)}:{line} imports {imported}")
    assert not violations, "imports against the layer order:\n" + "\n".join(violations)


def test_every_package_module_is_assigned_a_layer() -> None:
    unassigned = {p.relative_to(SOURCE).parts[0].removesuffix(".py") for p in SOURCE.rglob("*.py")} - set(
        LAYERS
    )
    assert unassigned <= {"__init__", "py"}, f"add these to LAYERS: {sorted(unassigned)}"


def test_import_drivetrain_imports_nothing_else_of_drivetrain() -> None:
    code = "import drivetrain, sys; print(sorted(m for m in sys.modules if m.startswith('drivetrain')))"
    output = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert output.strip() == "['drivetrain']"
