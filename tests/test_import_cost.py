"""What each public import loads: the front doors import their own class, not the rest of the package.

The time these imports take is a benchmark (``python -m benchmarks run --cases import_time``), not
a test; which modules they load is deterministic, and is what keeps that time low: callbacks,
loggers, loops, the data layer and the core are imported when a Trainer or an Accelerator is
built or run, and only the parts it uses.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

PROBE = """
import json, sys
import torch
before = set(sys.modules)
{statement}
print(json.dumps(sorted(m for m in set(sys.modules) - before)))
"""


def _loaded(statement: str) -> list[str]:
    completed = subprocess.run(
        [sys.executable, "-c", PROBE.format(statement=statement)], capture_output=True, text=True, timeout=120
    )
    assert completed.returncode == 0, completed.stderr
    return json.loads(completed.stdout)


def _packages(modules: list[str]) -> set[str]:
    return {".".join(m.split(".")[:2]) for m in modules if m.startswith("drivetrain.")}


def test_importing_the_trainer_loads_only_the_trainer_and_the_module() -> None:
    loaded = _loaded("from drivetrain import Trainer, TrainingModule, DataModule")
    assert _packages(loaded) == {"drivetrain._utilities", "drivetrain.trainer"}
    trainer_modules = {m for m in loaded if m.startswith("drivetrain.trainer.")}
    assert (
        trainer_modules
        <= {
            "drivetrain.trainer.trainer",
            "drivetrain.trainer.module",
            "drivetrain.trainer.loop_hooks",  # TrainingModule's mixins: the overridable loop hooks
            "drivetrain.trainer.module_tools",  # and freeze/toggle/export helpers (parts of the class itself)
            "drivetrain.trainer.datamodule",
            "drivetrain.trainer.hparams",
            "drivetrain.trainer.properties",
            "drivetrain.trainer.run_state",  # the run state's class (its parts are imported when a Trainer is built)
            "drivetrain.trainer.state",
            "drivetrain.trainer.retired_arguments",  # Lightning 1.x's arguments, refused with their history
        }
    ), "callbacks, loops, loggers and the core are imported when a Trainer is built or run"
    assert not [m for m in loaded if not m.startswith("drivetrain")], "no third-party or stdlib extras"


def test_importing_the_accelerator_loads_neither_the_trainer_nor_the_data_layer_nor_loggers() -> None:
    loaded = _loaded("from drivetrain import Accelerator")
    packages = _packages(loaded)
    assert "drivetrain.facade" in packages
    assert not packages & {
        "drivetrain.trainer",
        "drivetrain.loggers",
        "drivetrain.data",
        "drivetrain.connector",
        "drivetrain.plugins",
        "drivetrain.cli",
    }
    # The core's step policy and set-up order are small modules the façade's classes are built on;
    # no strategy, hardware plugin or registry is imported before an Accelerator is built.
    implementations = {"strategy", "single_device", "parallel", "ddp", "fsdp", "deepspeed", "xla", "registry"}
    assert not [
        m for m in loaded if m.startswith("drivetrain.strategies.") and m.split(".")[2] in implementations
    ]
    assert not [m for m in loaded if m.startswith("drivetrain.accelerators.")]


def test_a_built_trainer_loads_the_callbacks_and_loggers_it_uses_and_no_sharded_strategy() -> None:
    loaded = _loaded(
        "import drivetrain as dt; dt.Trainer(accelerator='cpu', devices=1, logger=False, enable_progress_bar=False)"
    )
    callbacks = {m.rsplit(".", 1)[1] for m in loaded if m.startswith("drivetrain.trainer.callbacks.")}
    default_ones = {"callback", "model_checkpoint", "model_summary", "progress", "plain_progress"}
    assert callbacks <= default_ones, "only the default ones (plain_progress: the bar's lines for a log file)"
    assert not [m for m in loaded if m.startswith("drivetrain.loggers.") and m not in _LOGGER_CORE]
    for absent in (
        "drivetrain.strategies.fsdp",
        "drivetrain.strategies.deepspeed",
        "drivetrain.strategies.xla",
    ):
        assert absent not in loaded
    assert "drivetrain.facade" not in _packages(loaded)
    assert not [
        m for m in loaded if m.startswith("drivetrain.trainer.loops.") and m.endswith(("fit", "evaluation"))
    ]


# What resolving logger=False needs: the base class and the resolver, not a logger implementation.
_LOGGER_CORE = {"drivetrain.loggers.logger", "drivetrain.loggers.registry", "drivetrain.loggers.resolve"}


@pytest.mark.parametrize(
    "statement",
    [
        "from drivetrain.utils import set_seed",
        "from drivetrain.strategies import Strategy",
        "from drivetrain.accelerators import Accelerator",
        "from drivetrain.trainer.callbacks import Callback",
    ],
)
def test_a_name_from_a_package_does_not_load_its_siblings(statement: str) -> None:
    loaded = _loaded(statement)
    for heavy in ("drivetrain.strategies.ddp", "drivetrain.trainer.trainer", "drivetrain.facade.accelerator"):
        assert heavy not in loaded, f"{statement} loaded {heavy}"


def test_subpackages_are_attributes_imported_on_first_use() -> None:
    # Lightning users write pl.callbacks.X / pl.loggers.X; here the packages resolve as attributes of the
    # lazy root and of every lazy package, without `import drivetrain` importing them.
    statement = (
        "import drivetrain as dt; loaded_by_import = sorted(m for m in sys.modules if m.startswith('drivetrain.'));"
        "names = [dt.trainer.callbacks.ModelCheckpoint, dt.loggers.CSVLogger, dt.strategies.DDPStrategy,"
        " dt.strategies.launchers.Launcher, dt.utils.set_seed, dt.plugins.precision.Precision,"
        " dt.plugins.environments.SLURMEnvironment, dt.accelerators.CPUAccelerator, dt.profilers.SimpleProfiler,"
        " dt.cli.main, dt.facade.Accelerator, dt.trainer.tuner.Tuner];"
        "assert [n.__name__ for n in names[:3]] == ['ModelCheckpoint', 'CSVLogger', 'DDPStrategy'];"
        "assert {'trainer', 'loggers', 'strategies'} <= set(dir(dt)) and 'callbacks' in dir(dt.trainer);"
        "print(json.dumps(loaded_by_import)); raise SystemExit"
    )
    completed = subprocess.run(
        [sys.executable, "-c", PROBE.format(statement=statement)], capture_output=True, text=True, timeout=120
    )
    assert completed.returncode == 0, completed.stderr
    assert json.loads(completed.stdout) == []
    missing = subprocess.run(
        [sys.executable, "-c", "import drivetrain as dt; dt.trainer.nothing_here"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "AttributeError: module 'drivetrain.trainer' has no attribute 'nothing_here'" in missing.stderr


def test_the_launch_command_loads_neither_the_other_commands_nor_yaml() -> None:
    # `drivetrain launch` starts the ranks only after it has parsed its command line: whatever it
    # imports first, every rank waits for.
    loaded = _loaded("from drivetrain.cli.main import build_parser; build_parser('launch')")
    assert "drivetrain.cli.launch" in loaded
    others = ("config", "env", "consolidate", "estimate_memory", "plot")
    assert not [m for m in loaded if m.rsplit(".", 1)[-1] in others], loaded
    assert "yaml" not in loaded, "the configuration file is read only when there is one"
    assert {"drivetrain.cli.config", "drivetrain.cli.plot"} <= set(
        _loaded("from drivetrain.cli.main import build_parser; build_parser()")
    )
