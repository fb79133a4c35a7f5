"""``drivetrain launch``: start a script on N processes per node, on one or several nodes.

Built on ``torch.distributed.run`` (torchrun): drivetrain adds no transport of its own. A single
node rendezvouses through one store this process hosts on loopback, on a free port (no port
races, nothing reachable from the network); several nodes use
``--master-addr``/``--master-port`` (static) or ``--rdzv-backend c10d --rdzv-endpoint host:port``.
If any process fails, torchrun stops the others and this command exits non-zero naming the rank
that failed first, how it ended and its error. The ranks die with this command (kill -9 included).

Accelerate's spellings work too (``--num_processes`` counts all nodes' processes,
``--num_machines``, ``--machine_rank``, ``--main_process_ip/port``, ``--same_network``,
``--mixed_precision``, ``--gradient_accumulation_steps``, ``--cpu``, ``--multi_gpu``,
``--gpu_ids``, ``--num_cpu_threads_per_process``, ``--enable_cpu_affinity``, ``--debug``,
``--max_restarts``, ``--monitor_interval``, ``--tee``, ``--log_dir``, ``--no_python``,
``--quiet``, ``--main_training_function``, ``--downcast_bf16``, ``--config_file``,
``--dynamo_backend``/``--dynamo_mode``/``--dynamo_use_fullgraph``/``--dynamo_use_dynamic``);
settings not on the command line come from the file ``drivetrain config`` writes (or
``accelerate config`` wrote). Precision and accumulation steps become the defaults of the
script's ``Accelerator``/``Trainer``; the dynamo settings (Accelerate's ``ACCELERATE_DYNAMO_*``
variables) and ``--debug`` (``ACCELERATE_DEBUG_MODE``) those of its ``Accelerator``. DeepSpeed
and FSDP are chosen by the script (``strategy='deepspeed_stage_2'``, ``'fsdp'``):
``--use_deepspeed``/``--use_fsdp`` say so and start nothing.

Examples::

    drivetrain launch -n 2 train.py --lr 0.1
    drivetrain launch --num_processes 2 --mixed_precision bf16 train.py
    drivetrain launch --accelerator xpu --nproc-per-node 2 train.py
    drivetrain launch --nnodes 2 --node-rank 0 --master-addr 10.0.0.1 --master-port 29400 train.py
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path
from typing import Any, NoReturn

from drivetrain.cli import launch_config, launch_options
from drivetrain.strategies.launchers.overrides import (
    ACCELERATOR_VARIABLE,
    ACCUMULATION_VARIABLE,
    PRECISION_VARIABLE,
)
from drivetrain.strategies.launchers.process_env import threads_per_process
from drivetrain.strategies.preemption import signal_name
from drivetrain.strategies.rank_failures import FailureRecord, drivetrain_error_data, root_cause


def add_launch_command(commands: Any) -> None:
    parser = commands.add_parser(
        "launch",
        help="run a training script on several processes (and nodes)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "-n",
        "--nproc-per-node",
        "--nproc_per_node",
        dest="nproc_per_node",
        default=None,
        help="processes per node, or 'auto' for the accelerator's device count (default)",
    )
    parser.add_argument(
        "--num_processes",
        "--num-processes",
        dest="num_processes",
        type=int,
        default=None,
        help="processes in total over all nodes (Accelerate's spelling; per node: this / --num_machines)",
    )
    parser.add_argument(
        "--nnodes",
        "--num_machines",
        "--num-machines",
        dest="nnodes",
        default=None,
        help="number of nodes, or MIN:MAX for an elastic job (default 1)",
    )
    parser.add_argument(
        "--node-rank",
        "--node_rank",
        "--machine_rank",
        "--machine-rank",
        dest="node_rank",
        type=int,
        default=None,
        help="rank of this node (static rendezvous)",
    )
    parser.add_argument(
        "--master-addr",
        "--master_addr",
        "--main_process_ip",
        "--main-process-ip",
        dest="master_addr",
        default=None,
        help="address of node 0 (static rendezvous)",
    )
    parser.add_argument(
        "--master-port",
        "--master_port",
        "--main_process_port",
        "--main-process-port",
        dest="master_port",
        type=int,
        default=None,
        help="port on node 0 (static rendezvous)",
    )
    parser.add_argument(
        "--rdzv-backend",
        "--rdzv_backend",
        dest="rdzv_backend",
        default=None,
        help="torchrun rendezvous backend",
    )
    parser.add_argument(
        "--rdzv-endpoint", dest="rdzv_endpoint", default=None, help="torchrun rendezvous endpoint"
    )
    parser.add_argument("--rdzv-id", dest="rdzv_id", default=None, help="torchrun rendezvous id")
    parser.add_argument(
        "--max-restarts",
        "--max_restarts",
        dest="max_restarts",
        type=int,
        default=0,
        help="restart the workers this many times on failure (default 0)",
    )
    parser.add_argument(
        "--monitor-interval",
        "--monitor_interval",
        dest="monitor_interval",
        type=float,
        default=None,
        help="seconds between torchrun's checks of the workers (default: torchrun's, 0.1)",
    )
    parser.add_argument(
        "--accelerator",
        default=None,
        help="accelerator name for the script's drivetrain objects (any registered name)",
    )
    parser.add_argument(
        "--cpu", action="store_true", default=None, help="run on the CPU (the same as --accelerator cpu)"
    )
    parser.add_argument(
        "--multi_gpu",
        "--multi-gpu",
        dest="multi_gpu",
        action="store_true",
        help="a multi-process run (Accelerate's flag): an error if only one process would start",
    )
    parser.add_argument(
        "--mixed_precision",
        "--mixed-precision",
        "--precision",
        dest="mixed_precision",
        default=None,
        help="the script's default precision: no, fp16, bf16 or any drivetrain name ('bf16-true' …)",
    )
    parser.add_argument(
        "--gradient_accumulation_steps",
        "--gradient-accumulation-steps",
        dest="gradient_accumulation_steps",
        type=int,
        default=None,
        help="the script's default batches per optimizer step",
    )
    parser.add_argument(
        "--dynamo_backend",
        "--dynamo-backend",
        dest="dynamo_backend",
        default=None,
        help="torch.compile the script's Accelerator models on this backend (inductor, aot_eager, eager …; no: off)",
    )
    parser.add_argument(
        "--dynamo_mode",
        "--dynamo-mode",
        dest="dynamo_mode",
        default=None,
        help="torch.compile mode: default, reduce-overhead, max-autotune, max-autotune-no-cudagraphs",
    )
    parser.add_argument(
        "--dynamo_use_fullgraph",
        "--dynamo-use-fullgraph",
        dest="dynamo_use_fullgraph",
        action="store_true",
        default=None,
        help="compile each model into one graph (an error at a graph break)",
    )
    parser.add_argument(
        "--dynamo_use_dynamic",
        "--dynamo-use-dynamic",
        dest="dynamo_use_dynamic",
        action="store_true",
        default=None,
        help="trace with dynamic shapes",
    )
    parser.add_argument(
        "--config_file",
        "--config-file",
        dest="config_file",
        default=None,
        help=f"launch settings written by `drivetrain config` (default: {launch_config.default_path()} if it exists)",
    )
    launch_options.add_accelerate_options(parser)
    parser.add_argument("-m", "--module", action="store_true", help="run the script argument as a module")
    parser.add_argument("script", help="the training script (or module with -m)")
    parser.add_argument("script_args", nargs=argparse.REMAINDER, help="arguments for the script")
    parser.set_defaults(run=run_launch)


def _fail(message: str) -> NoReturn:
    raise SystemExit(f"drivetrain launch: {message}")


def _with_config(args: argparse.Namespace) -> argparse.Namespace:
    """The command line, completed from the configuration file (the command line wins)."""
    path = Path(args.config_file) if args.config_file else launch_config.default_path()
    if args.config_file is None and not path.exists():
        return args
    try:
        config = launch_config.load(path)
    except FileNotFoundError:
        _fail(
            f"--config_file {path} does not exist (write one with `drivetrain config --config_file {path}`)."
        )
    except ValueError as error:
        _fail(str(error))
    print(f"drivetrain launch: settings from {path}", file=sys.stderr, flush=True)
    merged = argparse.Namespace(**vars(args))
    if args.nproc_per_node is not None:
        config.num_processes = None  # the command line's processes per node win over the file's total
    # The values that change nothing (Accelerate writes them into every file): the script's own
    # setting then wins without a warning; torchrun's default rendezvous is "static" already.
    if config.mixed_precision == "no":
        config.mixed_precision = None
    if config.gradient_accumulation_steps == 1:
        config.gradient_accumulation_steps = None
    if config.rdzv_backend == "static":
        config.rdzv_backend = None
    if config.dynamo_backend is not None and config.dynamo_backend.lower() == "no":
        config.dynamo_backend = None
    for key in ("debug", "enable_cpu_affinity", "downcast_bf16"):
        if getattr(config, key) is False:
            setattr(config, key, None)
    for option, key in (
        ("num_processes", "num_processes"),
        ("nnodes", "num_machines"),
        ("node_rank", "machine_rank"),
        ("master_addr", "main_process_ip"),
        ("master_port", "main_process_port"),
        ("rdzv_backend", "rdzv_backend"),
        ("mixed_precision", "mixed_precision"),
        ("gradient_accumulation_steps", "gradient_accumulation_steps"),
        ("cpu", "use_cpu"),
        ("accelerator", "accelerator"),
        ("dynamo_backend", "dynamo_backend"),
        ("dynamo_mode", "dynamo_mode"),
        ("dynamo_use_fullgraph", "dynamo_use_fullgraph"),
        ("dynamo_use_dynamic", "dynamo_use_dynamic"),
        ("same_network", "same_network"),
        ("debug", "debug"),
        ("gpu_ids", "gpu_ids"),
        ("enable_cpu_affinity", "enable_cpu_affinity"),
        ("main_training_function", "main_training_function"),
        ("downcast_bf16", "downcast_bf16"),
    ):
        value = getattr(config, key)
        if getattr(merged, option) is None and value is not None:
            setattr(merged, option, str(value) if option == "nnodes" else value)
    if merged.accelerator == "auto":
        merged.accelerator = None
    return merged


def _check_settings(args: argparse.Namespace) -> None:
    for option, key in (
        ("num_processes", "num_processes"),
        ("node_rank", "machine_rank"),
        ("master_port", "main_process_port"),
        ("mixed_precision", "mixed_precision"),
        ("gradient_accumulation_steps", "gradient_accumulation_steps"),
        ("dynamo_backend", "dynamo_backend"),
        ("dynamo_mode", "dynamo_mode"),
    ):
        try:
            launch_config.check_value(key, getattr(args, option), f"--{option}")
        except ValueError as error:
            _fail(str(error))
    if args.cpu:
        if args.accelerator not in (None, "cpu"):
            _fail(
                f"--cpu asks for the CPU, but --accelerator {args.accelerator} for other hardware; drop one."
            )
        args.accelerator = "cpu"


def _processes_per_node(args: argparse.Namespace) -> int:
    nodes = args.nnodes or "1"
    if args.num_processes is not None:
        if not nodes.isdigit() or int(nodes) < 1:
            _fail(
                f"--num_processes counts all nodes' processes, which needs a fixed number of nodes, not {nodes!r}."
            )
        per_node, remainder = divmod(args.num_processes, int(nodes))
        if remainder or per_node == 0:
            _fail(
                f"--num_processes {args.num_processes} cannot be shared equally by {nodes} nodes; give a multiple "
                f"of the number of nodes (or --nproc-per-node for the processes per node)."
            )
        if args.nproc_per_node not in (None, "auto", str(per_node)):
            _fail(
                f"--num_processes {args.num_processes} over {nodes} node(s) means {per_node} per node, but "
                f"--nproc-per-node says {args.nproc_per_node}; give one of them."
            )
        return per_node
    value = args.nproc_per_node or "auto"
    if value != "auto":
        if value.isdigit() and int(value) > 0:
            return int(value)
        _fail(f"--nproc-per-node must be a positive number or 'auto', got {value!r}.")
    from drivetrain.accelerators import AcceleratorRegistry, resolve_accelerator

    name = args.accelerator or "auto"
    if name not in ("auto", "gpu") and name not in AcceleratorRegistry:
        _fail(
            f"cannot count the devices of accelerator {name!r} here (it is not registered in this "
            f"process; the script may register it). Pass --nproc-per-node explicitly."
        )
    try:
        return resolve_accelerator(name).auto_device_count()
    except ValueError as error:
        _fail(f"{error} Or pass --nproc-per-node explicitly.")


def torchrun_arguments(args: argparse.Namespace, nproc_per_node: int) -> list[str]:
    """Translate our options into ``torch.distributed.run`` arguments."""
    arguments = [
        f"--nproc-per-node={nproc_per_node}",
        f"--nnodes={args.nnodes or 1}",
        f"--node-rank={args.node_rank or 0}",
        f"--max-restarts={args.max_restarts}",
    ]
    endpoint = args.rdzv_endpoint
    if (
        _several_nodes(args)
        and args.rdzv_backend not in (None, "static")
        and args.master_addr is not None
        and endpoint is None
    ):
        # A dynamic rendezvous (c10d …) meets at its endpoint: machine 0's address, as accelerate
        # launch does for machines not on one network. The static rendezvous meets at machine 0's
        # address whatever --same_network says (torchrun's --master-addr/--master-port).
        endpoint = f"{args.master_addr}:{args.master_port or 29500}"
    else:
        if args.master_addr is not None:
            arguments.append(f"--master-addr={args.master_addr}")
        if args.master_port is not None:
            arguments.append(f"--master-port={args.master_port}")
    for option, value in (
        ("rdzv-backend", args.rdzv_backend),
        ("rdzv-endpoint", endpoint),
        ("rdzv-id", args.rdzv_id),
    ):
        if value is not None:
            arguments.append(f"--{option}={value}")
    return [*arguments, *launch_options.torchrun_options(args), *launch_options.program(args)]


def _several_nodes(args: argparse.Namespace) -> bool:
    return str(args.nnodes or "1") not in ("1", "1:1")


def run_launch(args: argparse.Namespace) -> int:
    launch_options.check_accelerate_options(args)
    if not launch_options.script_exists(args):
        _fail(f"the script {args.script!r} does not exist (use -m to run a module).")
    args = _with_config(args)
    launch_options.check_accelerate_options(args)
    _check_settings(args)
    nproc_per_node = _processes_per_node(args)
    nodes = str(args.nnodes or "1")
    if args.multi_gpu and nproc_per_node * (int(nodes) if nodes.isdigit() else 2) < 2:
        _fail(
            "--multi_gpu asks for several processes, but only 1 would start: pass --num_processes N (N > 1)."
        )
    for variable, value in (
        (ACCELERATOR_VARIABLE, args.accelerator),
        (PRECISION_VARIABLE, args.mixed_precision),
        (ACCUMULATION_VARIABLE, args.gradient_accumulation_steps),
    ):
        if value is not None:
            os.environ[variable] = str(value)
    # Accelerate's own variables, read by the script's drivetrain.Accelerator (TorchDynamoPlugin).
    for variable, value in (
        ("ACCELERATE_DYNAMO_BACKEND", args.dynamo_backend),
        ("ACCELERATE_DYNAMO_MODE", args.dynamo_mode),
        ("ACCELERATE_DYNAMO_USE_FULLGRAPH", args.dynamo_use_fullgraph),
        ("ACCELERATE_DYNAMO_USE_DYNAMIC", args.dynamo_use_dynamic),
    ):
        if value is not None:
            os.environ[variable] = str(value).lower()
    launch_options.apply_accelerate_options(args, nproc_per_node)
    # torchrun would force 1 thread per process and warn; share the cores out instead.
    os.environ.setdefault("OMP_NUM_THREADS", str(threads_per_process(nproc_per_node)))
    # The ranks die with this process (see TorchElasticEnvironment.launcher_pid), even under kill -9.
    os.environ["DRIVETRAIN_LAUNCHER_PID"] = str(os.getpid())
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    from drivetrain.cli.loopback_rendezvous import loopback_rendezvous

    arguments = torchrun_arguments(args, nproc_per_node)
    if _single_node_without_rendezvous(args):
        arguments = [*loopback_rendezvous(nproc_per_node), *arguments]
    try:
        run(parse_args(arguments))
    except SignalException as error:  # this process got it: Kubernetes signals the first process
        return _signalled(args.script, error)
    except ChildFailedError as error:
        stopped = _preempted(error.failures)
        if stopped is not None:
            _say_preempted(args.script, stopped)
            return stopped
        print(
            f"drivetrain launch: {args.script} {describe_failures(error.failures)}.",
            file=sys.stderr,
            flush=True,
        )
        return 1
    return 0


#: What torchrun puts in a failure's ``error_file_data`` when the rank wrote no error file.
_NO_ERROR_FILE = "<NONE>"


def _say_preempted(script: str, code: int) -> None:
    print(
        f"drivetrain launch: {script} stopped for {signal_name(code - 128)} on every rank "
        f"(exit code {code}): its checkpoint was saved, and a new start resumes from it.",
        file=sys.stderr,
        flush=True,
    )


def _signalled(script: str, error: Any) -> int:
    """This process received a stop signal; torchrun has passed it on to the ranks and waited for them.

    Exits ``128 + signal`` as the ranks do. The ranks' endings (from torchrun's agent, found in
    the exception's frames) say whether every rank stopped and saved; where they cannot be found
    the message says only what this process did.
    """
    received = int(error.sigval)
    code = 128 + received
    endings = _rank_endings(error)
    if endings is not None and _preempted(endings) == code:
        _say_preempted(script, code)
        return code
    what = f"drivetrain launch: received {signal_name(received)} and passed it on to every rank of {script}"
    if endings:
        what += ": " + "; ".join(_ending(rank, ending) for rank, ending in sorted(endings.items()))
    elif endings is not None:
        what += ": every rank ended with exit code 0"
    print(f"{what} (exit code {code}).", file=sys.stderr, flush=True)
    return code


def _rank_endings(error: BaseException) -> dict[int, Any] | None:
    """How the ranks of this node ended (torchrun's ``ProcessFailure`` by local rank), when torchrun kept them.

    torchrun's agent raises the signal after stopping its ranks, without their endings; its
    process context, still referenced by the agent in the frames the exception went through,
    has them. ``None`` when that is not found (another torch version).
    """
    traceback = error.__traceback__
    while traceback is not None:
        for value in traceback.tb_frame.f_locals.values():
            context = getattr(value, "_pcontext", None)
            if context is not None and callable(getattr(context, "wait", None)):
                try:
                    result = context.wait(0)
                except Exception:
                    return None
                return dict(result.failures) if result is not None else None
        traceback = traceback.tb_next
    return None


def _preempted(failures: dict[int, Any]) -> int | None:
    """The exit code ``128 + signal`` of ranks that stopped for a preemption signal, if that is what happened.

    Such ranks exit with that code once the checkpoint is complete on every rank and write no
    error file (:class:`~drivetrain.strategies.preemption.Preempted`); torchrun then stops the
    ranks still exiting with ``SIGTERM``. Any other ending (an error file, another code or
    signal) is a failure.
    """
    stopped = {f.exitcode for f in failures.values() if f.exitcode > 0}
    wrote = [
        f
        for f in failures.values()
        if f.error_file_data and f.error_file_data.get("message") != _NO_ERROR_FILE
    ]
    others = [f for f in failures.values() if f.exitcode <= 0 and f.exitcode != -signal.SIGTERM]
    if len(stopped) != 1 or wrote or others:
        return None
    code = stopped.pop()
    return code if 128 < code < 128 + signal.NSIG else None


def _single_node_without_rendezvous(args: argparse.Namespace) -> bool:
    """One node, and no rendezvous options: drivetrain hosts the store, on loopback only."""
    options = (args.master_addr, args.master_port, args.rdzv_backend, args.rdzv_endpoint, args.rdzv_id)
    return not _several_nodes(args) and all(option is None for option in options)


def describe_failures(failures: dict[int, Any]) -> str:
    """The rank whose failure ended the job (how it ended, and its error), then what became of the others.

    ``failures`` are torchrun's ``ProcessFailure`` by global rank. torchrun stamps them to the
    second, too coarse to order ranks that fail together; the error files drivetrain's ranks
    write say which failure came first and which ranks only lost a peer.
    """
    ordered = sorted(failures.items(), key=lambda item: (item[1].timestamp, item[0]))
    records = _records(failures)
    cause = root_cause(records, [(rank, failure.exitcode) for rank, failure in ordered])
    if cause is None:
        return "was stopped"
    rank, record = cause
    text = f"failed: {_ending(rank, failures[rank])}" + (f" after {record.summary}" if record else "")
    others = [
        f"rank {r} was stopped by the launcher" if f.exitcode == -signal.SIGTERM else _ending(r, f)
        for r, f in ordered
        if r != rank
    ]
    return text + (f" ({'; '.join(others)})" if others else "")


def _ending(rank: int, failure: Any) -> str:
    code = failure.exitcode
    if code < 0:
        try:
            how = f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            how = f"was killed by signal {-code}"
    else:
        how = f"exited with code {code}"
    return f"rank {rank} (pid {failure.pid}) {how}"


def _records(failures: dict[int, Any]) -> list[FailureRecord]:
    """Failure records from the ranks' error files, in the order the ranks failed."""
    found = []
    for rank, failure in failures.items():
        data = failure.error_file_data or {}
        message = data.get("message")
        summary = message.get("message") if isinstance(message, dict) else message
        if not isinstance(summary, str) or not summary or summary == _NO_ERROR_FILE:
            continue  # the rank wrote no error file: it ended silently (a signal, os._exit)
        secondary, order, stamp = drivetrain_error_data(data)
        key = (
            order if order is not None else 1 << 62,
            stamp if stamp is not None else failure.timestamp * 10**9,
        )
        found.append((key, rank, failure.pid, summary.splitlines()[0], secondary))
    found.sort()
    return [
        FailureRecord(rank, pid, summary, "", secondary, order)
        for order, (_, rank, pid, summary, secondary) in enumerate(found, start=1)
    ]
