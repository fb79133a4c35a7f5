"""Import a training script and call one of its functions: ``drivetrain launch --main_training_function``.

    python -m drivetrain.cli.run_function [--module] SCRIPT FUNCTION [ARGS ...]

Each rank imports ``SCRIPT`` (a file, or a module with ``--module``) under its own name, not as
``__main__`` (so its ``if __name__ == "__main__":`` block does not run), and calls
``FUNCTION()`` with no arguments, as ``accelerate launch --main_training_function`` does on TPUs.
``sys.argv`` is ``[SCRIPT, *ARGS]``, so the function's own argument parsing sees the script's
arguments.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import sys
from pathlib import Path
from types import ModuleType


def _import_file(path: Path) -> ModuleType:
    name = path.stem if path.stem.isidentifier() else "training_script"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise SystemExit(
            f"drivetrain launch: cannot import {path} as Python (give a .py file, or -m for a module)."
        )
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # pickling its classes and functions (spawned workers) finds it
    spec.loader.exec_module(module)
    return module


def main(argv: list[str] | None = None) -> None:
    arguments = list(sys.argv[1:] if argv is None else argv)
    as_module = arguments[:1] == ["--module"]
    if as_module:
        arguments = arguments[1:]
    if len(arguments) < 2:
        raise SystemExit("usage: python -m drivetrain.cli.run_function [--module] SCRIPT FUNCTION [ARGS ...]")
    script, function_name, *script_arguments = arguments
    sys.argv = [script, *script_arguments]
    if as_module:
        module = importlib.import_module(script)
    else:
        path = Path(script).resolve()
        sys.path.insert(0, str(path.parent))  # as `python script.py` does: its folder's modules import
        module = _import_file(path)
    function = getattr(module, function_name, None)
    if not callable(function):
        found = sorted(
            name
            for name, value in vars(module).items()
            if inspect.isfunction(value) and value.__module__ == module.__name__
        )
        raise SystemExit(
            f"drivetrain launch: --main_training_function {function_name}: {script} has no function of that name "
            f"(its functions: {', '.join(found) or 'none'})."
        )
    function()


if __name__ == "__main__":
    main()
