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
import inspect
import sys

from drivetrain.cli import user_code


def main(argv: list[str] | None = None) -> None:
    arguments = list(sys.argv[1:] if argv is None else argv)
    as_module = arguments[:1] == ["--module"]
    if as_module:
        arguments = arguments[1:]
    if len(arguments) < 2:
        raise SystemExit("usage: python -m drivetrain.cli.run_function [--module] SCRIPT FUNCTION [ARGS ...]")
    script, function_name, *script_arguments = arguments
    sys.argv = [script, *script_arguments]
    try:
        module = importlib.import_module(script) if as_module else user_code.import_file(script)
    except ValueError as error:
        raise SystemExit(f"drivetrain launch: {error}") from None
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
