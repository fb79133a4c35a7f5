"""House rules checked mechanically: imports flow one way, and `import drivetrain` stays lazy.

The layers of docs/architecture.md, lowest first. A module may import from its own package and from lower
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
import tokenize
from pathlib import Path

SOURCE = Path(__file__).resolve().parents[1] / "src" / "drivetrain"

LAYERS: list[set[str]] = [
    {"_utilities"},
    {"logging"},  # drivetrain.logging: the public face of _utilities/log.py
    {"accelerators", "plugins"},
    {"strategies"},
    {"data", "loggers", "big_modeling", "profilers"},
    {"connector"},
    # Accelerate's public helpers and modules (accelerate.utils, .tracking, .hooks): below the façade.
    {"utils", "tracking", "hooks"},
    {"facade", "trainer"},  # the two front doors
    {"testing"},  # the plugin conformance kit: runs programs through both front doors
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


_GENERATOR_ACCESS = re.compile(
    r"\b(get_rng_state|set_rng_state|get_rng_state_all|getstate|setstate|get_state|set_state)\s*\("
)


def test_generator_states_are_read_and_set_in_one_module() -> None:
    """Checkpoints, epoch-start synchronisation and loader positions share strategies/rng.py (one schema,
    one rule for a device record from other hardware); the hardware accelerators implement its hooks, and the
    kit's stand-ins implement the device libraries' generators those hooks read (the kit calls the hooks to
    check them)."""
    allowed = {SOURCE / "strategies" / "rng.py"}
    offenders = [
        f"{path.relative_to(SOURCE)}:{number}: {line.strip()}"
        for path in sorted(SOURCE.rglob("*.py"))
        if path not in allowed
        and path.parent.name != "accelerators"
        and "testing" not in path.relative_to(SOURCE).parts
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if _GENERATOR_ACCESS.search(line) and not line.lstrip().startswith(("#", "def "))
    ]
    assert not offenders, "generator states handled outside drivetrain/strategies/rng.py:\n" + "\n".join(
        offenders
    )


_FRONT_DOORS = ("trainer", "facade", "data")  # callbacks live in trainer/callbacks
_CONCRETE = re.compile(
    r"drivetrain\.strategies\.(ddp|fsdp\w*|deepspeed\w*|model_parallel|xla|single_xla|single_device|"
    r"launchers\.multiprocessing|launchers\.subprocess_script)\b"
    r"|\b(DDP|FSDP|DeepSpeed|XLA|SingleDeviceXLA|SingleDevice|ModelParallel)Strategy\b"
    r"|\b(Multiprocessing|SubprocessScript)Launcher\b"
)
_SNIFFING = re.compile(r"sys\.modules|__(qual)?name__\s*(==|!=|in\b)")


def _code_lines(path: Path) -> dict[int, str]:
    """Each line's code with string literals (messages, docstrings) and comments left out."""
    kept: dict[int, list[str]] = {}
    with path.open("rb") as file:
        for token in tokenize.tokenize(file.readline):
            if token.type in (tokenize.STRING, tokenize.COMMENT, tokenize.ENCODING):
                continue
            kept.setdefault(token.start[0], []).append(token.string)
    return {number: " ".join(parts) for number, parts in kept.items()}


def test_front_doors_and_callbacks_ask_capabilities_not_types() -> None:
    """A new strategy works in both doors without an edit there: the doors read the strategy's declared
    capabilities (strategies/capabilities.py), never its class, a class name or which modules are loaded."""
    offenders = []
    for package in _FRONT_DOORS:
        for path in sorted((SOURCE / package).rglob("*.py")):
            for number, code in _code_lines(path).items():
                if "__name__ == " in code and "__main__" in path.read_text().splitlines()[number - 1]:
                    continue
                if _CONCRETE.search(code) or _SNIFFING.search(code):
                    offenders.append(f"{path.relative_to(SOURCE)}:{number}: {code.strip()}")
    assert not offenders, "type sniffing in a front door or callback:\n" + "\n".join(offenders)


# -- no import cycles ---------------------------------------------------------------------------------
def _runtime_imports(path: Path, modules: set[str]) -> set[str]:
    """The drivetrain modules ``path`` imports when it runs: module level and inside functions, not under
    ``TYPE_CHECKING``. ``from package import module`` counts the module; a package's own parents are not
    counted (importing ``drivetrain.x.y`` runs ``drivetrain/x/__init__.py`` first by design)."""
    tree = ast.parse(path.read_text())
    skipped = {
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        for inner in ast.walk(node)
    }
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            submodules = {f"{node.module}.{alias.name}" for alias in node.names} & modules
            found |= submodules if len(submodules) == len(node.names) else submodules | {node.module}
    resolved = set()
    for name in found:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        if name:
            resolved.add(name)
    return resolved


def _import_cycles(source: Path) -> list[list[str]]:
    paths = {
        ".".join(path.relative_to(source.parent).with_suffix("").parts).removesuffix(".__init__"): path
        for path in source.rglob("*.py")
    }
    modules = set(paths)
    graph = {
        module: {
            target
            for target in _runtime_imports(path, modules)
            if target != module and not module.startswith(target + ".")
        }
        for module, path in paths.items()
    }
    # Tarjan's strongly connected components: every group of two or more modules is a cycle.
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for target in graph[module]:
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            group = []
            while True:
                member = stack.pop()
                group.append(member)
                if member == module:
                    break
            if len(group) > 1:
                cycles.append(sorted(group))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return cycles


def test_no_import_cycles() -> None:
    """No module imports, even inside a function, one that imports it back: each layer reads top to bottom."""
    assert _import_cycles(SOURCE) == []


def test_the_cycle_check_finds_a_cycle_through_a_function_level_import(tmp_path: Path) -> None:
    package = tmp_path / "drivetrain"
    files = {
        "__init__.py": "",
        "strategies/__init__.py": "",
        "strategies/strategy.py": "from drivetrain.strategies.step_policy import clip\n",
        "strategies/step_policy.py": "def clip():\n    from drivetrain.strategies.strategy import Strategy\n",
        "strategies/other.py": (
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from drivetrain.strategies import strategy\n"
        ),
    }
    for name, code in files.items():
        (package / name).parent.mkdir(parents=True, exist_ok=True)
        (package / name).write_text(code)
    assert _import_cycles(package) == [
        ["drivetrain.strategies.step_policy", "drivetrain.strategies.strategy"]
    ]


def test_the_repository_cites_nothing_outside_itself() -> None:
    """The architecture and the house rules live in the repository (docs/architecture.md, CONTRIBUTING.md):
    no tracked file points at design notes or machines outside it."""
    root = SOURCE.parents[1]
    tracked = subprocess.run(["git", "ls-files"], cwd=root, capture_output=True, text=True, check=True).stdout
    outside = re.compile(r"\b(DESIGN|STYLE|MACHINE-NOTES)\.md\b|/work/shared|\.\./shared/")
    found = [
        f"{name}:{number}"
        for name in tracked.split()
        if name.endswith((".py", ".md", ".toml", ".yml", ".yaml", ".cfg", ".txt", ".sh"))
        or name.startswith("scripts/")
        if (root / name).is_file()
        for number, line in enumerate((root / name).read_text(errors="replace").splitlines(), 1)
        if outside.search(line) and name != "tests/test_architecture.py"
    ]
    assert found == [], f"files citing documents outside the repository: {found}"
    assert (root / "docs" / "architecture.md").is_file() and (root / "CONTRIBUTING.md").is_file()


def test_the_accelerators_parts_own_their_state() -> None:
    """The Accelerator is composed: its bases and services set their state in ``__init__`` (the registry of
    prepared objects is one object they are handed); none declares another part's attributes by annotation."""
    declared = [
        f"{path.name}: {node.name}.{ast.unparse(item.target)}"
        for path in sorted((SOURCE / "facade").glob("*.py"))
        for node in ast.parse(path.read_text()).body
        if isinstance(node, ast.ClassDef) and "__slots__" not in ast.unparse(node)
        for item in node.body
        if isinstance(item, ast.AnnAssign) and item.value is None
    ]
    assert declared == [], f"attributes declared, not set: {declared}"
