"""The hardware a check runs on (real, or faked with a stand-in) and the whole programs it runs there.

:class:`Hardware` says which accelerator the programs use and how it is faked; in this process it
is put in place for the contract checks (and taken away after them), in the programs' processes by
their settings. :func:`run_programs` runs the three programs on 1 and N processes, and the CLI
program once, and turns what they wrote into rows of the report.
"""

from __future__ import annotations

import dataclasses
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from drivetrain._utilities.imports import package_available
from drivetrain.accelerators import Accelerator, AcceleratorRegistry
from drivetrain.strategies import StrategyRegistry
from drivetrain.testing.fake import install_fake
from drivetrain.testing.kit_model import steps_per_epoch
from drivetrain.testing.outcomes import Outcomes
from drivetrain.testing.report import Report, failed, not_applicable, passed
from drivetrain.testing.runner import ProgramRun, run_cli, run_phase, run_scheduled, write_programs
from drivetrain.testing.settings import ProgramSettings, load, reference_of
from drivetrain.testing.stand_ins import STAND_INS, StandIn

#: The built-in accelerators whose device libraries the kit has stand-ins for.
_BUILTIN_STAND_INS = {
    "CUDAAccelerator": "cuda",
    "XPUAccelerator": "xpu",
    "MPSAccelerator": "mps",
    "XLAAccelerator": "xla",
    "HPUAccelerator": "hpu",
}


def builtin_stand_in(cls: type) -> str | None:
    """The stand-in for ``cls``'s device library when ``cls`` is (or extends) a built-in accelerator."""
    for base in cls.__mro__:
        if base.__module__.startswith("drivetrain.accelerators.") and base.__name__ in _BUILTIN_STAND_INS:
            return _BUILTIN_STAND_INS[base.__name__]
    return None


@dataclass
class Hardware:
    """The accelerator the checks and programs run on.

    Attributes:
        name: its registered name (what the front doors are given), or ``None`` when unregistered.
        cls: its class.
        fake: run on CPU tensors behind its own name (see :mod:`drivetrain.testing.fake`).
        stand_in: the stand-in for its device library (a built-in device type or ``"module:attribute"``).
        count: the devices the stand-in (or the forced fake) reports.
    """

    name: str | None
    cls: type[Accelerator]
    fake: bool = False
    stand_in: str | None = None
    count: int = 2

    @property
    def forced(self) -> bool:
        """A fake whose device library is absent and has no stand-in: the kit answers availability."""
        if not self.fake or self.stand_in is not None:
            return False
        try:
            return not self.cls.is_available()
        except Exception:
            return True

    def stand_in_instance(self) -> StandIn | None:
        if self.stand_in is None:
            return None

        cls = STAND_INS.get(self.stand_in) or load(self.stand_in)
        return cls(self.count)

    @contextmanager
    def installed(self) -> Iterator[tuple[StandIn | None, type[Accelerator] | None]]:
        """This hardware in this process (stand-in, fake), undone afterwards; yields them."""
        with ExitStack() as stack:
            stack.enter_context(AcceleratorRegistry.restored())
            stack.enter_context(StrategyRegistry.restored())
            stand_in = self.stand_in_instance()
            if stand_in is not None:
                stack.enter_context(stand_in)
            fake = None
            if self.fake:
                fake = install_fake(self.cls, forced_count=self.count if self.forced else None)
            yield stand_in, fake

    def settings(self, root: Path, **values: Any) -> ProgramSettings:
        accelerator_module = self.cls.__module__
        imports = [] if accelerator_module.startswith("drivetrain.") else [accelerator_module]
        settings = ProgramSettings(
            root=str(root),
            accelerator=self.name or "cpu",
            imports=imports,
            fake_class=reference_of(self.cls) if self.fake else None,
            stand_in=self.stand_in if self.fake else None,
            forced_count=self.count if self.forced else None,
        )
        return dataclasses.replace(settings, **values)


def new_root(root: str | Path | None, label: str) -> Path:
    """The folder of a check's programs: ``root/label`` when given, else a new temporary folder."""
    if root is None:
        return Path(tempfile.mkdtemp(prefix=f"drivetrain-check-{label}-"))
    folder = Path(root) / label
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def run_programs(
    report: Report,
    base: ProgramSettings,
    *,
    worlds: Sequence[int],
    kind: str,
    timeout: float,
    launch_accelerator: str | None = None,
    expect: tuple[str | None, str | None] = (None, None),
    by_name: str | None = None,
    accelerator_hooks: bool | None = None,
    scheduled: Sequence[dict[str, str]] | None = None,
    own_launcher: bool = False,
    job_variables: Mapping[str, str] | None = None,
) -> None:
    """Run the three programs for each number of processes in ``worlds`` and add their rows to ``report``.

    Args:
        base: the settings (``devices``/``launched`` are set here per world size).
        launch_accelerator: ``--accelerator`` for ``drivetrain launch``.
        expect: the class names the accelerator and the strategy must have in every process.
        by_name: how the plugin was named (``"accelerator='xpu'"``), for the registration row.
        accelerator_hooks: add the accelerator-hooks row (True: the accelerator keeps device state).
        scheduled: per-rank variables: the kit starts the processes itself, as a cluster's scheduler.
        own_launcher: the front doors start the other processes themselves (``devices=N`` in a plain
            ``python program.py``) instead of ``drivetrain launch``.
        job_variables: variables every process of the programs gets.
    """
    for world in worlds:
        root = Path(base.root) / f"{world}-process"
        write_programs(root)
        # Several processes are started outside the program: by `drivetrain launch`, or by the kit as a scheduler.
        launched = world > 1 and not own_launcher
        settings = dataclasses.replace(
            base, root=str(root), devices=world, launched=launched, collectives=world > 1
        )
        path = root / "settings.json"
        settings.write(path)
        runs: dict[str, ProgramRun] = {}
        for phase in ("first", "second", "third"):
            if scheduled is not None:
                runs[phase] = run_scheduled(settings, path, phase, timeout, scheduled[:world])
            else:
                runs[phase] = run_phase(settings, path, phase, timeout, launch_accelerator, job_variables)
        if world > 1:
            how = (
                "started by the kit as the cluster's scheduler would"
                if scheduled is not None
                else (
                    "started by the front doors' own launcher"
                    if own_launcher
                    else f"under drivetrain launch -n {world}"
                    + (f" --accelerator {launch_accelerator}" if launch_accelerator else "")
                )
            )
            report.notes.append(f"{world}-process programs: {how}.")
        outcomes = Outcomes(root, world, runs, kind, settings.tolerance)
        report.add(outcomes.trainer_stages())
        report.add(outcomes.trainer_resume())
        report.add(outcomes.accelerator_training())
        report.add(outcomes.accelerator_resume())
        if world > 1:
            report.add(outcomes.collectives())
        if by_name is not None:
            report.add(outcomes.names_everywhere(*expect, via=by_name))
        if accelerator_hooks is not None:
            report.add(outcomes.accelerator_hooks(accelerator_hooks))
        if kind == "strategy":
            report.add(outcomes.declarations())


def run_cli_program(
    report: Report,
    base: ProgramSettings,
    arguments: Sequence[str],
    devices: int,
    timeout: float,
    expect: tuple[str | None, str | None],
) -> None:
    """``python train.py fit <arguments> --trainer.devices=N`` through the training CLI, as one row."""
    shown = " ".join([*arguments, f"--trainer.devices={devices}"])
    check = f"CLI: python train.py fit {shown}"
    if not package_available("jsonargparse"):
        report.add(
            not_applicable(check, "the training CLI needs the cli extra: pip install 'drivetrain[cli]'")
        )
        return
    root = Path(base.root) / "cli"
    write_programs(root)
    settings = dataclasses.replace(base, root=str(root), devices=devices, launched=False)
    path = root / "settings.json"
    settings.write(path)
    options = [
        *arguments,
        f"--trainer.devices={devices}",
        "--trainer.max_epochs=1",
        "--trainer.logger=false",
        "--trainer.enable_progress_bar=false",
        "--trainer.enable_model_summary=false",
        "--trainer.enable_checkpointing=false",
        f"--trainer.default_root_dir={root}",
    ]
    run = run_cli(settings, path, options, timeout)
    result_path = root / "results" / "cli-rank0.pt"
    if run.returncode != 0 or not result_path.exists():
        how = "did not finish within its time limit" if run.timed_out else f"ended with {run.returncode}"
        report.add(
            failed(
                check,
                f"the CLI program {how}: {run.last_error()}",
                f"run it yourself: {run.command} (in {root}, with DRIVETRAIN_KIT_SETTINGS={path})",
            )
        )
        return
    import torch

    result = torch.load(result_path, weights_only=True)
    problems = []
    if result["steps"] != steps_per_epoch(devices):
        problems.append(f"the fit made {result['steps']} steps, expected {steps_per_epoch(devices)}")
    if result["world_size"] != devices:
        problems.append(f"the trainer ran {result['world_size']} processes, expected {devices}")
    for kind, want in zip(("accelerator", "strategy"), expect, strict=True):
        if want is not None and result[kind] != want:
            problems.append(f"the trainer built {result[kind]} for the {kind}, not {want}")
    report.add(
        passed(check)
        if not problems
        else failed(check, "; ".join(problems) + ".", "register the name in a module the script imports")
    )


def row_for_missing_worlds(report: Report, wanted: Sequence[int], allowed: Sequence[int], why: str) -> None:
    """A not-applicable row for each process count in ``wanted`` that the plugin cannot run, and a note of the rest."""
    for world in wanted:
        if world not in allowed:
            report.add(not_applicable(f"{world} process{'es' if world > 1 else ''}: whole programs", why))
    if list(wanted) != [1, 2]:
        report.notes.append(
            f"processes={list(wanted)}: the whole programs ran on {list(allowed) or 'no'} process count(s) only."
        )
