"""``drivetrain launch``: start a script on N processes per node, on one or several nodes.

Built on ``torch.distributed.run`` (torchrun): drivetrain adds no transport of its own. A single
node rendezvouses through one store this process hosts on loopback, on a free port (no port
races, nothing reachable from the network); several nodes use
``--master-addr``/``--master-port`` (static) or ``--rdzv-backend c10d --rdzv-endpoint host:port``.
If any process fails, torchrun stops the others and this command exits non-zero naming the rank
that failed first, how it ended and its error. The ranks die with this command (kill -9 included).

Examples::

    drivetrain launch -n 2 train.py --lr 0.1
    drivetrain launch --accelerator xpu --nproc-per-node 2 train.py
    drivetrain launch --nnodes 2 --node-rank 0 --master-addr 10.0.0.1 --master-port 29400 train.py
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from typing import Any

from drivetrain.cli.loopback_rendezvous import loopback_rendezvous
from drivetrain.strategies.launchers.overrides import ACCELERATOR_VARIABLE
from drivetrain.strategies.launchers.process_env import threads_per_process
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
        default="auto",
        help="processes per node, or 'auto' for the accelerator's device count (default)",
    )
    parser.add_argument(
        "--nnodes", default="1", help="number of nodes, or MIN:MAX for an elastic job (default 1)"
    )
    parser.add_argument(
        "--node-rank",
        "--node_rank",
        dest="node_rank",
        type=int,
        default=0,
        help="rank of this node (static rendezvous)",
    )
    parser.add_argument(
        "--master-addr",
        "--master_addr",
        dest="master_addr",
        default=None,
        help="address of node 0 (static rendezvous)",
    )
    parser.add_argument(
        "--master-port",
        "--master_port",
        dest="master_port",
        type=int,
        default=None,
        help="port on node 0 (static rendezvous)",
    )
    parser.add_argument(
        "--rdzv-backend", dest="rdzv_backend", default=None, help="torchrun rendezvous backend"
    )
    parser.add_argument(
        "--rdzv-endpoint", dest="rdzv_endpoint", default=None, help="torchrun rendezvous endpoint"
    )
    parser.add_argument("--rdzv-id", dest="rdzv_id", default=None, help="torchrun rendezvous id")
    parser.add_argument(
        "--max-restarts",
        dest="max_restarts",
        type=int,
        default=0,
        help="restart the workers this many times on failure (default 0)",
    )
    parser.add_argument(
        "--accelerator",
        default=None,
        help="accelerator name for the script's drivetrain objects (any registered name)",
    )
    parser.add_argument("-m", "--module", action="store_true", help="run the script argument as a module")
    parser.add_argument("script", help="the training script (or module with -m)")
    parser.add_argument("script_args", nargs=argparse.REMAINDER, help="arguments for the script")
    parser.set_defaults(run=run_launch)


def _processes_per_node(value: str, accelerator: str | None) -> int:
    if value != "auto":
        if value.isdigit() and int(value) > 0:
            return int(value)
        raise SystemExit(
            f"drivetrain launch: --nproc-per-node must be a positive number or 'auto', got {value!r}."
        )
    from drivetrain.accelerators import AcceleratorRegistry, resolve_accelerator

    name = accelerator or "auto"
    if name not in ("auto", "gpu") and name not in AcceleratorRegistry:
        raise SystemExit(
            f"drivetrain launch: cannot count the devices of accelerator {name!r} here (it is not registered in this "
            f"process; the script may register it). Pass --nproc-per-node explicitly."
        )
    try:
        return resolve_accelerator(name).auto_device_count()
    except ValueError as error:
        raise SystemExit(f"drivetrain launch: {error} Or pass --nproc-per-node explicitly.") from None


def torchrun_arguments(args: argparse.Namespace, nproc_per_node: int) -> list[str]:
    """Translate our options into ``torch.distributed.run`` arguments."""
    arguments = [
        f"--nproc-per-node={nproc_per_node}",
        f"--nnodes={args.nnodes}",
        f"--node-rank={args.node_rank}",
        f"--max-restarts={args.max_restarts}",
    ]
    if args.master_addr is not None:
        arguments.append(f"--master-addr={args.master_addr}")
    if args.master_port is not None:
        arguments.append(f"--master-port={args.master_port}")
    for option in ("rdzv_backend", "rdzv_endpoint", "rdzv_id"):
        value = getattr(args, option)
        if value is not None:
            arguments.append(f"--{option.replace('_', '-')}={value}")
    if args.module:
        arguments.append("-m")
    return [*arguments, args.script, *args.script_args]


def run_launch(args: argparse.Namespace) -> int:
    if not args.module and not os.path.exists(args.script):
        raise SystemExit(
            f"drivetrain launch: the script {args.script!r} does not exist (use -m to run a module)."
        )
    nproc_per_node = _processes_per_node(args.nproc_per_node, args.accelerator)
    if args.accelerator:
        os.environ[ACCELERATOR_VARIABLE] = args.accelerator
    # torchrun would force 1 thread per process and warn; share the cores out instead.
    os.environ.setdefault("OMP_NUM_THREADS", str(threads_per_process(nproc_per_node)))
    # The ranks die with this process (see TorchElasticEnvironment.launcher_pid), even under kill -9.
    os.environ["DRIVETRAIN_LAUNCHER_PID"] = str(os.getpid())
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    arguments = torchrun_arguments(args, nproc_per_node)
    if _single_node_without_rendezvous(args):
        arguments = [*loopback_rendezvous(nproc_per_node), *arguments]
    try:
        run(parse_args(arguments))
    except ChildFailedError as error:
        print(
            f"drivetrain launch: {args.script} {describe_failures(error.failures)}.",
            file=sys.stderr,
            flush=True,
        )
        return 1
    return 0


def _single_node_without_rendezvous(args: argparse.Namespace) -> bool:
    """One node, and no rendezvous options: drivetrain hosts the store, on loopback only."""
    options = (args.master_addr, args.master_port, args.rdzv_backend, args.rdzv_endpoint, args.rdzv_id)
    return str(args.nnodes) in ("1", "1:1") and all(option is None for option in options)


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
        if not isinstance(summary, str) or not summary:
            continue
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
