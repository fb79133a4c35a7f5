"""Run one of Accelerate's test scripts on drivetrain in this process, recording every sub-test.

    python runner.py --package SITE/accelerate --script test_ops --results DIR

(or under ``drivetrain launch -n 2``). The script file is loaded from the installed accelerate
package with its ``accelerate`` imports redirected to drivetrain (:mod:`hook`). Each sub-test
function (see :mod:`manifest`) is wrapped so that its outcome is written to
``DIR/rank<R>.jsonl`` as it finishes and a failure does not stop the script: its ``main()`` goes
on with the next sub-test, as far as it can. Nothing of the script is changed.
"""

from __future__ import annotations

import argparse
import ast
import functools
import importlib.util
import inspect
import json
import os
import sys
import time
import traceback
import types
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

sys.path.insert(0, str(Path(__file__).resolve().parent))

import accelerate_package
import hook
import manifest

MAIN = "<main>"
IMPORT = "<import>"


def subtests_of(source: str, helpers: frozenset[str]) -> list[str]:
    """The script's own functions that its ``main()`` calls, in the order they appear there."""
    tree = ast.parse(source)
    functions = {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}
    main = next(node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == "main")
    calls = sorted(
        (node.lineno, node.col_offset, node.func.id)
        for node in ast.walk(main)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in functions
    )
    found: list[str] = []
    for _, _, name in calls:
        if name not in found and name not in helpers and name != "main":
            found.append(name)
    return found


def _short(error: BaseException) -> str:
    text = f"{type(error).__name__}: {error}".strip()
    first = text.splitlines()[0] if text else type(error).__name__
    return first[:400]


class Recorder:
    """Writes one JSON line per finished sub-test (flushed, so a hang keeps what finished)."""

    def __init__(self, stream: TextIO, rank: int, labels: dict[str, tuple[str, ...]]) -> None:
        self.stream = stream
        self.rank = rank
        self.labels = labels
        self.calls: Counter[str] = Counter()
        self.ids: Counter[str] = Counter()

    def write(self, subtest: str, status: str, seconds: float = 0.0, error: str | None = None) -> None:
        record = {"id": subtest, "status": status, "seconds": round(seconds, 3), "rank": self.rank}
        if error is not None:
            record["error"] = error
        self.stream.write(json.dumps(record) + "\n")
        self.stream.flush()

    def subtest_id(self, name: str, arguments: dict[str, Any]) -> str:
        self.calls[name] += 1
        labels = self.labels.get(name)
        if labels and self.calls[name] <= len(labels):
            return f"{name}[{labels[self.calls[name] - 1]}]"
        simple = ", ".join(
            f"{key}={value!r}"
            for key, value in arguments.items()
            if isinstance(value, (bool, int, float, str)) or value is None
        )
        base = f"{name}({simple})"
        self.ids[base] += 1
        return base if self.ids[base] == 1 else f"{base}[call {self.ids[base]}]"

    def wrap(self, name: str, function: Callable[..., Any]) -> Callable[..., Any]:
        signature = inspect.signature(function)

        @functools.wraps(function)
        def recorded(*args: Any, **kwargs: Any) -> Any:
            subtest = self.subtest_id(name, signature.bind(*args, **kwargs).arguments)
            started = time.perf_counter()
            try:
                result = function(*args, **kwargs)
            except KeyboardInterrupt:
                raise
            except BaseException as error:  # pytest.fail and friends derive from BaseException
                print(f"[compat] rank {self.rank}: {subtest} FAILED", file=sys.stderr, flush=True)
                traceback.print_exc()
                self.write(subtest, "fail", time.perf_counter() - started, _short(error))
                return None
            self.write(subtest, "pass", time.perf_counter() - started)
            return result

        return recorded


class _Stub(types.ModuleType):
    """A Hugging Face library that is not installed: its ``set_verbosity_*`` do nothing, the rest raises."""

    def __getattr__(self, attribute: str) -> Any:
        if attribute.startswith("__"):
            raise AttributeError(attribute)
        if attribute.startswith("set_verbosity"):
            return lambda *args, **kwargs: None  # logging verbosity of a library that is not there
        child = _Stub(f"{self.__name__}.{attribute}")
        setattr(self, attribute, child)
        return child

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise hook.MissingEquivalent(f"{self.__name__} is not installed: the sub-tests using it do not apply")


def install_stubs(names: tuple[str, ...]) -> None:
    for name in names:
        sys.modules[name] = _Stub(name)


def run(package: Path, script: manifest.Script, stream: TextIO, rank: int, world_size: int) -> None:
    recorder = Recorder(stream, rank, script.labels)
    hook.install(package)
    accelerate_package.add_user_packages(package)  # datasets …, as users who have them installed
    install_stubs(script.stub_modules)
    path = package / script.path
    source = path.read_text()
    spec = importlib.util.spec_from_file_location(f"accelerate_script_{script.name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    started = time.perf_counter()
    try:
        spec.loader.exec_module(module)
    except Exception as error:
        traceback.print_exc()
        recorder.write(IMPORT, "fail", time.perf_counter() - started, _short(error))
        return
    names = subtests_of(source, script.helpers)
    names += [extra.function for extra in script.extras if extra.function not in names]
    for name in dict.fromkeys(names):
        setattr(module, name, recorder.wrap(name, getattr(module, name)))
    for extra in script.extras:
        if world_size in extra.world_sizes:
            getattr(module, extra.function)(**extra.kwargs)
    started = time.perf_counter()
    try:
        module.main()
    except Exception as error:
        traceback.print_exc()
        recorder.write(MAIN, "fail", time.perf_counter() - started, _short(error))
        return
    recorder.write(MAIN, "pass", time.perf_counter() - started)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--package", type=Path, required=True, help="the installed accelerate package directory"
    )
    parser.add_argument("--script", required=True, choices=sorted(manifest.BY_NAME))
    parser.add_argument("--results", type=Path, required=True, help="folder for rank<R>.jsonl")
    args = parser.parse_args(argv)
    rank = int(os.environ.get("RANK", "0"))
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    args.results.mkdir(parents=True, exist_ok=True)
    with open(args.results / f"rank{rank}.jsonl", "a") as stream:
        run(args.package, manifest.BY_NAME[args.script], stream, rank, world_size)
    return 0


if __name__ == "__main__":
    sys.exit(main())
