"""Test-suite set-up: helpers on sys.path, a clean environment, registries restored after each test."""

from __future__ import annotations

import gc
import os
import sys
import tempfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

# DeepSpeed's compiled ops go to the venv's own cache (prebuilt there by scripts/install-test-deps):
# builds record the venv's paths, and a build killed half-way in a shared cache leaves a lock
# that makes every later DeepSpeed process wait forever.
os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(Path(sys.prefix) / "torch-extensions"))

# `drivetrain launch` reads the settings `drivetrain config` wrote under XDG_CONFIG_HOME: the
# developer's own file must not change what the tests launch (this folder stays empty).
_CONFIG_HOME = tempfile.TemporaryDirectory(prefix="drivetrain-tests-config-")
os.environ["XDG_CONFIG_HOME"] = _CONFIG_HOME.name

if os.environ.get("LOCAL_RANK", "0") != "0" and "PYTEST_XDIST_WORKER" not in os.environ:
    # A test built a multi-device Trainer/Accelerator inside the pytest process, so the script
    # launcher re-ran pytest itself as rank 1; the autouse fixture below would then clear
    # LOCAL_RANK and that copy would launch again, without end. Stop the copy at once.
    raise SystemExit(
        "pytest was re-run as a worker rank (LOCAL_RANK="
        f"{os.environ['LOCAL_RANK']}): a test started a multi-process run in the pytest process. "
        "Run multi-process programs as scripts (tests/helpers/scripts.py) or with a spawn strategy."
    )

_LAUNCHER_VARIABLES = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "NODE_RANK",
    "GROUP_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RUN_ID",
    "DRIVETRAIN_ACCELERATOR",
    "DRIVETRAIN_PRECISION",
    "DRIVETRAIN_GRADIENT_ACCUMULATION_STEPS",
    "SLURM_NTASKS",
    "SLURM_JOB_NAME",
    "OMPI_COMM_WORLD_SIZE",
    "PMI_SIZE",
    "LSB_JOBID",
    "JSM_NAMESPACE_SIZE",
    "KUBERNETES_PORT",
)


@pytest.fixture(autouse=True)
def _no_launcher_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests start as a plain single process, whatever launched pytest."""
    for name in _LAUNCHER_VARIABLES:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(autouse=True)
def _trackers_stay_offline(monkeypatch: pytest.MonkeyPatch) -> None:
    """No test reaches a tracking service: W&B runs offline, MLflow uses the store a test names."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)


@pytest.fixture(autouse=True)
def _restore_registries() -> object:
    """Registrations made by a test (custom accelerators, strategies, precisions, loggers) end with it."""
    from drivetrain.accelerators import AcceleratorRegistry
    from drivetrain.loggers.registry import LoggerRegistry
    from drivetrain.plugins.precision import PrecisionRegistry
    from drivetrain.strategies import StrategyRegistry

    registries = (AcceleratorRegistry, StrategyRegistry, PrecisionRegistry, LoggerRegistry)
    for registry in registries:
        registry.available()  # load the built-ins first, so the snapshot holds them
    saved = [dict(r._entries) for r in registries]
    yield
    for registry, entries in zip(registries, saved):
        registry._entries.clear()
        registry._entries.update(entries)


@pytest.fixture
def hardware(monkeypatch: pytest.MonkeyPatch) -> object:
    """No CUDA, XPU, MPS or XLA, whatever this machine has; tests switch on what they need."""
    from helpers.fake_hardware import FakeHardware

    return FakeHardware(monkeypatch)


@pytest.fixture(autouse=True)
def _forked_ranks_start_warm(request: pytest.FixtureRequest) -> None:
    """Multi-process tests: torch._dynamo imported before any rank forks.

    Forked ranks (``helpers.multiprocess``, the ``ddp_fork`` strategy, the kill-point forks) then
    skip that import; see :func:`helpers.multiprocess.import_before_fork`.
    """
    if request.node.get_closest_marker("multiprocess") is not None:
        from helpers.multiprocess import import_before_fork

        import_before_fork()


@pytest.fixture(autouse=True)
def _no_process_group_left_behind(request: pytest.FixtureRequest) -> object:
    """A test that leaves a default process group in the pytest process fails, and the group goes with it.

    Ranks forked later (``helpers.multiprocess``) would inherit it and refuse to join their own
    ("trying to initialize the default process group twice"), failing every multi-process test after
    the leaking one. A one-process parallel strategy keeps its group for the script's next entry point:
    a test that builds one in the pytest process tears it down (``strategy.teardown()``).
    """
    yield
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
        pytest.fail(f"{request.node.nodeid} left a default process group in the pytest process; tear it down")


#: The registries a test may add its own plugins to (imported on first use; see _registries_as_found).
_REGISTRY_MODULES = {
    "drivetrain.accelerators.registry": "AcceleratorRegistry",
    "drivetrain.strategies.registry": "StrategyRegistry",
    "drivetrain.loggers.registry": "LoggerRegistry",
    "drivetrain.plugins.precision.names": "PrecisionRegistry",
}


_KIT = "drivetrain.testing"


@pytest.fixture(autouse=True)
def _registries_as_found() -> object:
    """A plugin a test registers is gone after it: the next test on this worker sees the registries as before.

    Under pytest-xdist every test after one that registered a name (say ``"pocket"``) would find it
    listed among the available ones. Built-in entries, loaded lazily by any test, stay.
    """
    found = {
        name: dict(getattr(sys.modules[module], name)._entries)
        for module, name in _REGISTRY_MODULES.items()
        if module in sys.modules
    }
    yield
    for module, name in _REGISTRY_MODULES.items():
        if module not in sys.modules:
            continue
        registry = getattr(sys.modules[module], name)
        before = found.get(name, {})
        for key, entry in list(registry._entries.items()):
            if before.get(key) is entry or (entry.is_builtin and not entry.cls.__module__.startswith(_KIT)):
                continue  # as found, or a built-in loaded on first use (the kit's stand-ins are not)
            if key in before:
                registry._entries[key] = before[key]
            else:
                del registry._entries[key]


def _freeze_survivors() -> None:
    """Collect, then move every surviving object out of the collector's sight (``gc.freeze()``).

    A worker's heap only grows (modules, collected items, reports: ~700k objects late in a run),
    and each full collection walks all of it: ~15 % of a worker's time in single-process tests.
    Ranks forked from the worker (``helpers.multiprocess``, ``ddp_fork``, the kill-point forks)
    walked it too, copying every page they touched. Frozen at the start and between modules
    (module fixtures already torn down), it stays shared and unwalked: pytest took 807-812 s on a
    fresh clone against 840 s without. Only what is still alive at a module's end is frozen; what a
    test creates and drops is collected as before.
    """
    gc.collect()
    gc.freeze()


def pytest_collection_finish(session: pytest.Session) -> None:
    _freeze_survivors()


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    if nextitem is not None and getattr(nextitem, "module", None) is not getattr(item, "module", None):
        _freeze_survivors()
