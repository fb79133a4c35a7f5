"""``check_accelerator``, ``check_strategy``, ``check_precision``, ``check_checkpoint_io``, ``check_cluster_environment``.

Each runs the contract checks of its kind of plugin in this process (cheap: no processes started),
then, with ``whole_programs=True`` (the default), the kit's programs with the plugin in them
through both front doors on 1 and 2 processes where the plugin allows (each program start takes
seconds: a full check takes a minute or two), and the training CLI once. The result is a
:class:`~drivetrain.testing.report.Report`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from drivetrain.accelerators import Accelerator, AcceleratorRegistry, devices_for
from drivetrain.connector import connect
from drivetrain.plugins import CheckpointIO, ClusterEnvironment, Precision, PrecisionRegistry
from drivetrain.plugins.precision import precision_from_name
from drivetrain.strategies import ParallelStrategy, Strategy, StrategyRegistry, XLAStrategy
from drivetrain.testing.contracts import rows
from drivetrain.testing.contracts.accelerator import accelerator_checks, registered_names
from drivetrain.testing.contracts.checkpoint_io import checkpoint_io_checks
from drivetrain.testing.contracts.environment import environment_checks, rank_variables, variables
from drivetrain.testing.contracts.precision import precision_checks
from drivetrain.testing.contracts.strategy import registered_names as strategy_names
from drivetrain.testing.contracts.strategy import strategy_checks
from drivetrain.testing.harness import (
    Hardware,
    builtin_stand_in,
    new_root,
    row_for_missing_worlds,
    run_cli_program,
    run_programs,
)
from drivetrain.testing.report import Report, not_applicable
from drivetrain.testing.runner import free_port
from drivetrain.testing.settings import PLUGIN, load, reference_of

#: Seconds one program may run before it counts as hung.
DEFAULT_TIMEOUT = 300.0


_NOT_MOVABLE = "cannot be imported by another process: move it into a module"


def _programs_apply(report: Report, whole_programs: bool, importable: bool, why_not: str) -> bool:
    """Whether the whole programs run after the contract checks; notes or reports why not."""
    if not whole_programs:
        report.notes.append("whole_programs=False: the contract checks only.")
        return False
    if not importable:
        report.add(not_applicable("whole programs", why_not))
        return False
    return True


def _resolve(plugin: Any, registry: Any) -> tuple[Any, str | None, str | None]:
    """(the class or instance, its registered name if given by name, ``"module:attr"`` to load it elsewhere)."""
    if isinstance(plugin, str) and ":" in plugin:
        return load(plugin), None, plugin
    if isinstance(plugin, str):
        if registry is None or plugin not in registry:
            raise ValueError(f"{plugin!r} is neither 'module:attribute' nor a registered name here.")
        return registry.entry(plugin).cls, plugin, None
    return plugin, None, reference_of(plugin if isinstance(plugin, type) else type(plugin))


def _imports(*modules: str | None) -> list[str]:
    return [m for m in dict.fromkeys(modules) if m and not m.startswith("drivetrain.")]


def _hardware(accelerator: str, fake: bool, stand_in: Any, devices: int) -> Hardware:
    cls = AcceleratorRegistry.entry(accelerator).cls
    chosen = builtin_stand_in(cls) if stand_in == "auto" else stand_in
    if isinstance(chosen, type):
        chosen = reference_of(chosen)
    return Hardware(accelerator, cls, fake=fake, stand_in=chosen if fake else None, count=max(devices, 2))


def _worlds(processes: Sequence[int] | None, allowed: int) -> tuple[list[int], list[int]]:
    wanted = list(processes) if processes is not None else [1, 2]
    return wanted, [w for w in wanted if w <= allowed]


def check_accelerator(
    accelerator: type[Accelerator] | str,
    devices: int = 2,
    *,
    fake: bool = False,
    stand_in: str | type | None = "auto",
    whole_programs: bool = True,
    processes: Sequence[int] | None = None,
    cli: bool = True,
    timeout: float = DEFAULT_TIMEOUT,
    root: str | Path | None = None,
) -> Report:
    """Check a hardware accelerator: its contract, then whole programs through both front doors.

    Args:
        accelerator: the class, ``"module:Class"``, or a registered name.
        devices: how many devices the multi-process programs use (at most this many processes).
        fake: run on CPU tensors behind the accelerator's own name, for CI without the hardware
            (see :mod:`drivetrain.testing.fake`); ``False`` runs on the real hardware.
        stand_in: the stand-in for the device library with ``fake=True``: ``"auto"`` (the kit's
            own for drivetrain's built-in accelerators and their subclasses, none otherwise), a
            device type the kit has one for (``"cuda"``, ``"xpu"``, ``"mps"``, ``"xla"``, ``"hpu"``),
            a :class:`~drivetrain.testing.stand_ins.StandIn` subclass, or ``None``.
        whole_programs: run the programs (``False``: the contract checks only, in seconds).
        processes: the process counts for the programs (default ``(1, 2)``, less where the
            accelerator has fewer devices).
        cli: also run ``python train.py fit --trainer.accelerator=NAME`` through the training CLI.
        timeout: seconds each program may take before it counts as hung.
        root: where the programs' folders go (a new temporary folder when ``None``).
    """
    cls, name, reference = _resolve(accelerator, AcceleratorRegistry)
    names = registered_names(cls) if isinstance(cls, type) else []
    name = name or (names[0] if names else None)
    chosen = builtin_stand_in(cls) if stand_in == "auto" and isinstance(cls, type) else stand_in
    if isinstance(chosen, type):
        chosen = reference_of(chosen)
    hardware = Hardware(name, cls, fake=fake, stand_in=chosen if fake else None, count=max(devices, 2))
    label = f"{getattr(cls, '__name__', cls)}" + (f" ({name})" if name else "")
    report = Report(label, "accelerator")
    with hardware.installed() as (stand_in_object, fake_class):
        forced = fake_class if hardware.forced else None
        report.add(rows(accelerator_checks(cls, devices, stand_in_object, fake, forced=forced)))
        available = _device_count(cls, hardware, devices)
    if fake:
        if stand_in_object is not None:
            library = f"the {stand_in_object.library} stand-in"
        elif hardware.forced:
            library = "no stand-in (the kit answered is_available() and auto_device_count())"
        else:
            library = "its own device library (importable here)"

        report.notes.append(
            f"fake=True: {label} ran against {library}, its devices translated to CPU devices."
        )
    reference = reference or reference_of(cls)
    if not _programs_apply(
        report,
        whole_programs,
        reference is not None,
        f"{label} cannot be imported by another process (defined in __main__ or a function): move it into a module",
    ):
        return report

    if report.failures and any(
        r.name.startswith("accelerator: get_parallel_devices") for r in report.failures
    ):
        report.add(
            not_applicable("whole programs", "skipped: the accelerator cannot give its devices (see above)")
        )
        return report
    wanted, allowed = _worlds(processes, available)
    why = f"{cls.__name__} offers {available} device(s) here"
    if builtin_stand_in(cls) == "xla" and fake:
        allowed = [w for w in allowed if w == 1]
        why = "XLA starts one process per device with torch_xla's own multiprocessing, which the torch_xla stand-in cannot start; run with fake=False on a TPU host"
    row_for_missing_worlds(report, wanted, allowed, why)
    base = hardware.settings(
        new_root(root, "accelerator"), accelerator=name or PLUGIN, target=reference if name is None else None
    )
    base.imports = _imports(cls.__module__, *base.imports)
    if name is None:
        base.accelerator = PLUGIN
    reports_state = _keeps_device_state(hardware)
    run_programs(
        report,
        base,
        worlds=allowed,
        kind="accelerator",
        timeout=timeout,
        launch_accelerator=name,
        expect=(cls.__name__, None),
        by_name=f"accelerator={name!r}" if name else f"accelerator={cls.__name__}()",
        accelerator_hooks=reports_state,
    )
    if cli and not allowed:
        report.add(not_applicable("CLI", f"no whole programs run here: {why}"))
    elif cli:
        if name is None:
            report.add(
                not_applicable(
                    "CLI: python train.py fit --trainer.accelerator=NAME",
                    "the accelerator has no registered name for the command line",
                )
            )
        else:
            run_cli_program(
                report, base, [f"--trainer.accelerator={name}"], max(allowed), timeout, (cls.__name__, None)
            )
    return report


def _device_count(cls: Any, hardware: Hardware, devices: int) -> int:
    """How many processes (up to ``devices``) the accelerator can give devices for here."""
    if hardware.forced:
        return devices
    for count in range(devices, 0, -1):
        try:
            if len(devices_for(cls(), count)) == count:
                return count
        except Exception:
            continue
    return 0


def _keeps_device_state(hardware: Hardware) -> bool:
    with hardware.installed() as (_, fake_class):
        cls = fake_class or hardware.cls
        try:
            instance = cls()
            instance.setup_device(devices_for(instance, 1)[0])

            return instance.get_rng_state() is not None
        except Exception:
            return False


def check_strategy(
    strategy: type[Strategy] | str,
    *,
    accelerator: str = "cpu",
    devices: int = 2,
    fake: bool = False,
    stand_in: str | type | None = "auto",
    whole_programs: bool = True,
    processes: Sequence[int] | None = None,
    cli: bool = True,
    imports: Sequence[str] = (),
    timeout: float = DEFAULT_TIMEOUT,
    root: str | Path | None = None,
) -> Report:
    """Check a strategy: constructor, wiring and declarations, then whole programs and its collectives.

    Args:
        strategy: the class, ``"module:Class"``, or a registered name (a preset, e.g. one holding a
            custom checkpoint IO).
        accelerator: the registered accelerator to run it on (``fake``/``stand_in`` as for
            :func:`check_accelerator`).
        imports: modules that register the names used (a preset's module), imported by every program.

    A single-process strategy (not a :class:`~drivetrain.strategies.ParallelStrategy`) runs its
    programs on one process only. See :func:`check_accelerator` for the other arguments.
    """
    for module in imports:
        __import__(module)
    cls, name, reference = _resolve(strategy, StrategyRegistry)
    names = strategy_names(cls) if isinstance(cls, type) and name is None else ([name] if name else [])
    name = name or (names[0] if names else None)
    entry = StrategyRegistry.entry(name) if name else None
    label = f"{getattr(cls, '__name__', cls)}" + (f" ({name})" if name else "")
    report = Report(label, "strategy")
    hardware = _hardware(accelerator, fake, stand_in, devices)

    def make(**plugins: Any) -> Any:
        kwargs = dict(entry.init_kwargs) if entry is not None else {}
        kwargs.update(plugins)
        return cls(**kwargs)

    with hardware.installed():
        report.add(rows(strategy_checks(cls, make, accelerator)))
    if not _programs_apply(
        report, whole_programs, name is not None or reference is not None, f"{label} {_NOT_MOVABLE}"
    ):
        return report
    parallel = isinstance(cls, type) and issubclass(cls, ParallelStrategy)
    wanted, allowed = _worlds(processes, devices if parallel else 1)
    why = f"{cls.__name__} runs one process" if not parallel else f"devices={devices}"
    if fake and isinstance(cls, type) and issubclass(cls, XLAStrategy):
        allowed = []
        why = (
            "XLAStrategy takes its device and ranks from the XLA runtime (xm.xla_device, torch_xla's multiprocessing), "
            "which the torch_xla stand-in does not run; run with fake=False on a TPU host"
        )
    elif parallel and getattr(cls, "kind", None) == "model_parallel" and 2 in allowed:
        allowed = [w for w in allowed if w == 1]
        why = (
            f"{cls.__name__} declares kind='model_parallel': it shards what the module's configure_model applies "
            f"(tensor-parallel plans, fully_shard on self.device_mesh), and the kit's generic model has no plan; "
            f"drivetrain's own tests run it with one (tests/strategies/test_model_parallel.py)"
        )
    elif parallel:
        starter = _own_launcher(make, accelerator, hardware)
        if starter is not None:
            allowed = []
            why = (
                f"{cls.__name__} runs the training in a function it starts in new processes ({starter}): the "
                f"Trainer inside fit(), the Accelerator through accelerator.launch(function); the kit's programs "
                f"are scripts run as they are (under drivetrain launch for 2 processes), which it refuses. Its "
                f"contract applies; drivetrain's own tests run these strategies through every stage "
                f"(tests/trainer/test_strategy_stages.py)"
            )
    row_for_missing_worlds(report, wanted, allowed, why)
    base = hardware.settings(
        new_root(root, "strategy"), strategy=name or PLUGIN, target=None if name else reference
    )
    base.imports = _imports(*imports, getattr(cls, "__module__", None), *base.imports)
    run_programs(
        report,
        base,
        worlds=allowed,
        kind="strategy",
        timeout=timeout,
        launch_accelerator=accelerator if accelerator != "cpu" else None,
        expect=(None, cls.__name__),
        by_name=f"strategy={name!r}" if name else f"strategy={cls.__name__}()",
    )
    if cli and not allowed:
        report.add(not_applicable("CLI", f"no whole programs run here: {why}"))
    elif cli:
        if name is None:
            report.add(
                not_applicable(
                    "CLI: python train.py fit --trainer.strategy=NAME",
                    f"{cls.__name__} has no registered name for the command line",
                )
            )
        else:
            arguments = [f"--trainer.accelerator={accelerator}", f"--trainer.strategy={name}"]
            run_cli_program(report, base, arguments, max(allowed), timeout, (None, cls.__name__))
    return report


def _own_launcher(make: Any, accelerator: str, hardware: Hardware) -> str | None:
    """How a parallel strategy starts 2 processes when that is not by re-running the script (None: it is)."""

    with hardware.installed():
        try:
            strategy = connect(accelerator=accelerator, strategy=make(), devices=2)
        except Exception:
            return None  # the programs will say what is wrong
        start_method = getattr(strategy, "start_method", "popen")
        launcher = strategy.launcher
    if start_method != "popen":
        return f"start_method={start_method!r}"
    if launcher is not None and type(launcher).__name__ != "SubprocessScriptLauncher":
        return type(launcher).__name__
    return None


def check_precision(
    precision: type[Precision] | str,
    *,
    accelerator: str = "cpu",
    whole_programs: bool = True,
    processes: Sequence[int] | None = None,
    cli: bool = True,
    tolerance: float = 0.05,
    timeout: float = DEFAULT_TIMEOUT,
    root: str | Path | None = None,
) -> Report:
    """Check a precision plugin: its hooks and state, then whole programs with it through both front doors.

    Args:
        precision: the class, ``"module:Class"``, or a registered precision name.
        tolerance: how far evaluation results may be from the float32 computation (relative and
            absolute): low precisions round.

    See :func:`check_accelerator` for the other arguments.
    """
    cls, name, reference = _resolve(precision, PrecisionRegistry)
    if name is None and isinstance(cls, type):
        found = [e.name for e in PrecisionRegistry.describe() if e.cls is cls and not e.init_kwargs]
        name = found[0] if found else None
    label = f"{getattr(cls, '__name__', cls)}" + (f" ({name})" if name else "")
    report = Report(label, "precision")

    def make() -> Any:
        if name is not None:  # as connect() builds it for the accelerator's devices
            device_type = devices_for(AcceleratorRegistry.get(accelerator), 1)[0].type
            return precision_from_name(name, device_type)
        return cls()

    report.add(rows(precision_checks(cls, make)))
    if not _programs_apply(
        report, whole_programs, name is not None or reference is not None, f"{label} {_NOT_MOVABLE}"
    ):
        return report
    _wanted, allowed = _worlds(processes, 2)
    base = Hardware(accelerator, AcceleratorRegistry.entry(accelerator).cls).settings(
        new_root(root, "precision"),
        precision=name or PLUGIN,
        target=None if name else reference,
        tolerance=tolerance,
    )
    base.imports = _imports(getattr(cls, "__module__", None))
    run_programs(report, base, worlds=allowed, kind="precision", timeout=timeout)
    if cli:
        if name is None:
            report.add(
                not_applicable(
                    "CLI: python train.py fit --trainer.precision=NAME",
                    f"{cls.__name__} has no registered name for the command line",
                )
            )
        else:
            run_cli_program(
                report,
                base,
                [f"--trainer.accelerator={accelerator}", f"--trainer.precision={name}"],
                1,
                timeout,
                (None, None),
            )
    return report


def check_checkpoint_io(
    checkpoint_io: type[CheckpointIO] | CheckpointIO | str,
    path_or_url: str | Path | None = None,
    *,
    whole_programs: bool = True,
    processes: Sequence[int] | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    root: str | Path | None = None,
) -> Report:
    """Check a checkpoint IO: round trips, crash safety and removal, then whole programs that save and resume with it.

    Args:
        checkpoint_io: the class (built without arguments), an instance, or ``"module:attribute"``.
        path_or_url: where the contract checks write (a local folder, or a URL such as
            ``"s3://bucket/kit"``: the crash check then does not apply); a temporary folder when ``None``.

    The programs (on local disk) pass it in ``plugins=`` to both front doors.
    """
    plugin, _, reference = _resolve(checkpoint_io, None)
    cls = plugin if isinstance(plugin, type) else type(plugin)
    report = Report(cls.__name__, "checkpoint_io")

    def make() -> Any:
        return plugin() if isinstance(plugin, type) else plugin

    report.add(rows(checkpoint_io_checks(cls, make, str(path_or_url) if path_or_url is not None else None)))
    if (
        not _programs_apply(
            report,
            whole_programs,
            reference is not None,
            f"pass 'module:attribute' of {cls.__name__} (or its class) so other processes can build it",
        )
        or reference is None
    ):
        return report
    _wanted, allowed = _worlds(processes, 2)
    base = Hardware("cpu", AcceleratorRegistry.entry("cpu").cls).settings(
        new_root(root, "checkpoint_io"), plugins=[PLUGIN], target=reference
    )
    base.imports = _imports(reference.partition(":")[0])
    run_programs(report, base, worlds=allowed, kind="checkpoint_io", timeout=timeout)
    report.add(
        not_applicable(
            "CLI",
            "checkpoint IOs have no short names; a config file's trainer.plugins (class_path) reaches them, and the programs above use the same Trainer",
        )
    )
    return report


def check_cluster_environment(
    environment: type[ClusterEnvironment] | str,
    env: Mapping[str, str],
    *,
    world_size: int = 2,
    whole_programs: bool = True,
    timeout: float = DEFAULT_TIMEOUT,
    root: str | Path | None = None,
) -> Report:
    """Check a cluster environment under a job's variables, then run the programs in such a job.

    Args:
        environment: the class (built without arguments) or ``"module:Class"``.
        env: the variables the scheduler sets for each process; values may say ``{rank}``,
            ``{local_rank}``, ``{node_rank}``, ``{world_size}`` and ``{port}`` (a free port), e.g.
            ``{"MYSCHED_RANK": "{rank}", "MYSCHED_NTASKS": "{world_size}", "MYSCHED_PORT": "{port}"}``.
        world_size: the processes of the job (one node).

    When the environment creates its processes externally the kit starts them itself, as the
    scheduler would; otherwise drivetrain's launcher does, under the same variables.
    """
    cls, _, reference = _resolve(environment, None)
    report = Report(getattr(cls, "__name__", str(cls)), "cluster_environment")
    ranks = rank_variables(env, world_size, free_port())
    report.add(rows(environment_checks(cls, cls, ranks)))
    if (
        not _programs_apply(report, whole_programs, reference is not None, f"{report.plugin} {_NOT_MOVABLE}")
        or reference is None
    ):
        return report
    if report.failures:
        report.add(
            not_applicable("whole programs", "skipped: the environment does not describe the job (see above)")
        )
        return report

    with variables(ranks[0]):
        external = bool(cls().creates_processes_externally)
    base = Hardware("cpu", AcceleratorRegistry.entry("cpu").cls).settings(
        new_root(root, "cluster_environment"), plugins=[PLUGIN], target=reference
    )
    base.imports = _imports(reference.partition(":")[0])
    run_programs(
        report,
        base,
        worlds=[world_size],
        kind="cluster_environment",
        timeout=timeout,
        scheduled=ranks if external else None,
        own_launcher=not external,
        job_variables=ranks[0],
    )
    return report
