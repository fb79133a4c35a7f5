"""Importing the user's code named on a command line: a module of the current folder, or a file.

``drivetrain estimate-memory gpt2_model:GPT2`` and ``--main_training_function`` import code the
way ``python`` does for a script: a module name is looked up in the current folder first (the
``drivetrain`` console script does not put it on ``sys.path`` by itself), and a file path
(``./gpt2_model.py``) is imported from that file, with its folder on ``sys.path`` so that its own
imports of neighbouring modules work.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType


def is_file_path(name: str) -> bool:
    """Whether ``name`` names a file (``x.py``, or anything with a path separator) rather than a module."""
    return name.endswith(".py") or "/" in name or os.sep in name


def import_file(path: str | Path) -> ModuleType:
    """Import the Python file ``path`` under its stem's name (registered in ``sys.modules``).

    Raises:
        ValueError: ``path`` is not a file, or not one Python can import.
    """
    resolved = Path(path).expanduser().resolve()
    if not resolved.is_file():
        raise ValueError(f"{path} is not a file.")
    folder = str(resolved.parent)
    if folder not in sys.path:
        sys.path.insert(0, folder)  # as `python file.py`: the file's neighbours import
    name = resolved.stem if resolved.stem.isidentifier() else "user_script"
    spec = importlib.util.spec_from_file_location(name, resolved)
    if spec is None or spec.loader is None:
        raise ValueError(f"cannot import {path} as Python (give a .py file).")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # pickling its classes and functions (spawned workers) finds them
    spec.loader.exec_module(module)
    return module


def import_module(name: str) -> ModuleType:
    """Import a module by name, or a file by path (:func:`is_file_path`), as ``python`` in this folder would."""
    if is_file_path(name):
        return import_file(name)
    here = os.getcwd()
    if here not in sys.path and "" not in sys.path:
        sys.path.insert(0, here)
    return importlib.import_module(name)
