"""What a kit program needs to know: the plugin under test and how to put it in, as a JSON file.

The kit (the parent) writes one :class:`ProgramSettings` per run; the programs it starts (and the
processes those start: the Trainer's own launcher re-runs the script) find it through the
``DRIVETRAIN_KIT_SETTINGS`` environment variable.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SETTINGS_VARIABLE = "DRIVETRAIN_KIT_SETTINGS"
#: In ``accelerator``/``strategy``/``precision``/``plugins``: build the object from ``target``.
PLUGIN = "@plugin"


@dataclass
class ProgramSettings:
    """The run of one plugin's programs.

    Attributes:
        root: the run's folder (results, checkpoints, the scripts).
        target: ``"module:attribute"`` of the plugin under test (a class, or an instance at module level).
        imports: modules to import before anything else (they register the plugin's names).
        accelerator, strategy: a registered name or :data:`PLUGIN`.
        precision: a name, :data:`PLUGIN`, or ``None`` for the default.
        plugins: :data:`PLUGIN` entries for ``plugins=`` (checkpoint IO, cluster environment).
        fake_class: ``"module:attribute"`` of an accelerator class to run on CPU tensors (``fake=True``).
        stand_in: the stand-in for its device library: a built-in's device type (``"hpu"``) or
            ``"module:attribute"`` of a :class:`~drivetrain.testing.stand_ins.StandIn` subclass.
        forced_count: with a fake and no stand-in, the device count the fake answers.
        devices: the number of processes of this run.
        launched: whether the processes are started outside the program (``drivetrain launch``,
            the kit acting as a scheduler) rather than by the front doors' own launcher.
        kill_step: the step after whose checkpoint the killed runs die.
        collectives: check the strategy's collectives (parallel strategies on several processes).
        tolerance: absolute tolerance of evaluation results against the expectation (low precisions).
    """

    root: str
    target: str | None = None
    imports: list[str] = field(default_factory=list)
    accelerator: str = "cpu"
    strategy: str = "auto"
    precision: str | None = None
    plugins: list[str] = field(default_factory=list)
    fake_class: str | None = None
    stand_in: str | None = None
    forced_count: int | None = None
    devices: int = 1
    launched: bool = False
    kill_step: int = 6
    collectives: bool = False
    tolerance: float = 1e-5

    def write(self, path: Path) -> None:
        path.write_text(json.dumps(dataclasses.asdict(self), indent=1))

    @classmethod
    def from_environment(cls) -> ProgramSettings:
        path = os.environ.get(SETTINGS_VARIABLE)
        if not path:
            raise RuntimeError(
                f"This is a drivetrain.testing program; run it through the kit (drivetrain check-plugin), which "
                f"sets {SETTINGS_VARIABLE}."
            )
        return cls(**json.loads(Path(path).read_text()))


def load(reference: str) -> Any:
    """The object ``"module:attribute"`` (dots in the attribute walk into it) names."""
    module_name, _, attribute = reference.partition(":")
    value: Any = importlib.import_module(module_name)
    for part in attribute.split(".") if attribute else []:
        value = getattr(value, part)
    return value


def reference_of(obj: Any) -> str | None:
    """``"module:qualname"`` for a class or function importable from another process, else ``None``."""
    module, qualname = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    if not module or not qualname or module == "__main__" or "<locals>" in qualname:
        return None
    try:
        return f"{module}:{qualname}" if load(f"{module}:{qualname}") is obj else None
    except (ImportError, AttributeError):
        return None
