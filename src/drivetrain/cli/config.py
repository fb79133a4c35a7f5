"""``drivetrain config``: write the launch settings ``drivetrain launch`` reads by default.

Asks a few questions (Enter takes the value in brackets), or with ``--default`` writes the
values given as flags without asking, like ``accelerate config``::

    drivetrain config                                   # questions
    drivetrain config --default --num_processes 2 --mixed_precision bf16
    drivetrain config --config_file team.yaml           # then: drivetrain launch --config_file team.yaml ...

``drivetrain config default`` is ``accelerate config default``: it writes a basic file for this
machine without asking (one process per GPU, or one CPU process where there is no accelerator),
and never replaces a file that exists::

    drivetrain config default [--config_file PATH] [--mixed_precision no|fp16|bf16]
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from drivetrain.cli import launch_config
from drivetrain.cli.launch_config import LaunchConfig


def add_config_command(commands: Any) -> None:
    parser = commands.add_parser(
        "config",
        help="write the settings `drivetrain launch` reads (questions, or --default with flags)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--config_file",
        "--config-file",
        dest="config_file",
        default=None,
        help=f"where to write (default: {launch_config.default_path()})",
    )
    parser.add_argument(
        "--default",
        action="store_true",
        help="ask nothing: write the values of the flags below (and defaults)",
    )
    parser.add_argument("--num_processes", "--num-processes", dest="num_processes", type=int, default=None)
    parser.add_argument("--num_machines", "--num-machines", dest="num_machines", type=int, default=None)
    parser.add_argument("--machine_rank", "--machine-rank", dest="machine_rank", type=int, default=None)
    parser.add_argument("--main_process_ip", "--main-process-ip", dest="main_process_ip", default=None)
    parser.add_argument(
        "--main_process_port", "--main-process-port", dest="main_process_port", type=int, default=None
    )
    parser.add_argument("--mixed_precision", "--mixed-precision", dest="mixed_precision", default=None)
    parser.add_argument(
        "--gradient_accumulation_steps",
        "--gradient-accumulation-steps",
        dest="gradient_accumulation_steps",
        type=int,
        default=None,
    )
    parser.add_argument("--cpu", dest="use_cpu", action="store_true", default=None, help="run on the CPU")
    parser.add_argument(
        "--accelerator", default=None, help="accelerator name (any registered name; default auto)"
    )
    parser.add_argument(
        "--dynamo_backend",
        "--dynamo-backend",
        dest="dynamo_backend",
        default=None,
        help="torch.compile backend for the Accelerator's models (no, inductor, aot_eager, eager …)",
    )
    parser.set_defaults(run=run_config)
    actions = parser.add_subparsers(dest="config_action", metavar="ACTION")
    default = actions.add_parser(
        "default",
        help="write a basic file for this machine without questions (as `accelerate config default`)",
        description=(
            "Write a basic launch settings file for this machine: one process per device of the best "
            "accelerator here (one CPU process where there is none). An existing file is left as it is."
        ),
    )
    default.add_argument(
        "--config_file",
        "--config-file",
        dest="config_file",
        default=None,
        help=f"where to write (default: {launch_config.default_path()})",
    )
    default.add_argument(
        "--mixed_precision",
        "--mixed-precision",
        dest="mixed_precision",
        choices=("no", "fp16", "bf16"),
        default="no",
        help="the precision the launched scripts default to (default: no)",
    )
    default.set_defaults(run=run_config_default)


@dataclasses.dataclass(frozen=True)
class Question:
    key: str
    text: str
    default: Any
    parse: Callable[[str], Any]
    asked: Callable[[dict[str, Any]], bool] = lambda answers: True


def _yes_no(text: str) -> bool:
    value = text.strip().lower()
    if value in ("y", "yes", "true", "1"):
        return True
    if value in ("n", "no", "false", "0"):
        return False
    raise ValueError("answer yes or no")


def _integer(text: str) -> int:
    try:
        return int(text.strip())
    except ValueError:
        raise ValueError(f"{text.strip()!r} is not a whole number") from None


def _several_machines(answers: dict[str, Any]) -> bool:
    return int(answers.get("num_machines") or 1) > 1


QUESTIONS = (
    Question("use_cpu", "Run on the CPU only? [yes/no]", False, _yes_no),
    Question(
        "accelerator",
        "Which accelerator (auto, cuda, gpu, mps, xpu, or a registered name)?",
        "auto",
        str.strip,
        lambda answers: not answers.get("use_cpu"),
    ),
    Question("num_machines", "How many machines (nodes)?", 1, _integer),
    Question("machine_rank", "The rank of this machine (0 for the first)?", 0, _integer, _several_machines),
    Question("main_process_ip", "The IP address of machine 0?", None, str.strip, _several_machines),
    Question("main_process_port", "The port on machine 0?", 29500, _integer, _several_machines),
    Question("num_processes", "How many processes in total, over all machines?", 1, _integer),
    Question("mixed_precision", "Mixed precision (no, fp16, bf16)?", "no", str.strip),
    Question("gradient_accumulation_steps", "Gradient accumulation steps?", 1, _integer),
    Question(
        "dynamo_backend",
        "torch.compile the Accelerator's models with which backend (no, inductor, aot_eager, eager …)?",
        "no",
        str.strip,
    ),
)


def _ask(question: Question, default: Any, read: Callable[[str], str]) -> Any:
    shown = (
        "" if default is None else f" [{'yes' if default is True else 'no' if default is False else default}]"
    )
    while True:
        try:
            text = read(f"{question.text}{shown} ")
        except EOFError:
            raise SystemExit(
                "drivetrain config: no answer (standard input closed). Run `drivetrain config --default` with "
                "flags to write the file without questions."
            ) from None
        if not text.strip():
            if default is None:
                print("  an answer is needed here.")
                continue
            return default
        try:
            value = question.parse(text)
            return launch_config.check_value(question.key, value, "answer")
        except ValueError as error:
            print(f"  {error}; try again.")


def ask_questions(given: dict[str, Any], read: Callable[[str], str] = input) -> LaunchConfig:
    """The configuration from answers; values given as flags are the defaults shown."""
    answers: dict[str, Any] = {}
    for question in QUESTIONS:
        if not question.asked(answers):
            continue
        default = given.get(question.key)
        answers[question.key] = _ask(question, question.default if default is None else default, read)
    return _config(answers)


def _config(values: dict[str, Any]) -> LaunchConfig:
    chosen = {key: value for key, value in values.items() if value is not None}
    if str(chosen.get("dynamo_backend", "")).lower() == "no":
        del chosen["dynamo_backend"]  # the default: nothing to write
    if chosen.get("use_cpu"):
        if chosen.get("accelerator", "auto") not in ("auto", "cpu"):
            raise SystemExit(
                f"drivetrain config: --cpu asks for the CPU, but --accelerator {chosen['accelerator']} for other "
                f"hardware; drop one."
            )
        chosen["accelerator"] = "cpu"
    machines = chosen.get("num_machines", 1)
    processes = chosen.get("num_processes", 1)
    if processes % machines:
        raise SystemExit(
            f"drivetrain config: {processes} processes cannot be shared equally by {machines} machines; "
            f"give a multiple of the number of machines."
        )
    if machines > 1 and not chosen.get("main_process_ip"):
        raise SystemExit("drivetrain config: several machines need main_process_ip (machine 0's address).")
    return LaunchConfig(**chosen)


def run_config(args: argparse.Namespace) -> int:
    path = Path(args.config_file) if args.config_file else launch_config.default_path()
    given = {field.name: getattr(args, field.name, None) for field in dataclasses.fields(LaunchConfig)}
    for key, value in given.items():
        try:
            launch_config.check_value(key, value, f"--{key}")
        except ValueError as error:
            raise SystemExit(f"drivetrain config: {error}") from None
    if args.default:
        defaults = {question.key: question.default for question in QUESTIONS}
        config = _config({**defaults, **{k: v for k, v in given.items() if v is not None}})
    else:
        if not sys.stdin.isatty():
            print("drivetrain config: reading the answers from standard input", file=sys.stderr)
        config = ask_questions(given)
    launch_config.save(config, path)
    print(
        f"drivetrain config: wrote {path}; `drivetrain launch` reads it by default"
        + ("" if args.config_file is None else f" with --config_file {path}")
    )
    return 0


def basic_config(mixed_precision: str = "no") -> LaunchConfig:
    """What ``drivetrain config default`` writes on this machine (as Accelerate's ``write_basic_config``)."""
    from drivetrain.accelerators import CPUAccelerator, resolve_accelerator

    hardware = resolve_accelerator("auto")
    on_cpu = isinstance(hardware, CPUAccelerator)
    return LaunchConfig(
        num_processes=1 if on_cpu else hardware.auto_device_count(),
        num_machines=1,
        machine_rank=0,
        mixed_precision=mixed_precision,
        use_cpu=on_cpu,
        accelerator="cpu" if on_cpu else "auto",
        debug=False,
    )


def write_basic_config(mixed_precision: str = "no", save_location: str | Path | None = None) -> Path | bool:
    """Write :func:`basic_config` to ``save_location`` (default: where ``drivetrain launch`` looks).

    Accelerate's ``write_basic_config``: a file that exists is left as it is (a message says so)
    and ``False`` is returned; else the path written.

    Raises:
        ValueError: ``mixed_precision`` is not ``"no"``, ``"fp16"`` or ``"bf16"``.
    """
    if not isinstance(mixed_precision, str) or mixed_precision.lower() not in ("no", "fp16", "bf16"):
        raise ValueError(f"mixed_precision must be 'no', 'fp16' or 'bf16', got {mixed_precision!r}.")
    path = Path(save_location) if save_location is not None else launch_config.default_path()
    if path.exists():
        print(
            f"drivetrain config default: {path} exists and is left as it is; edit it, run `drivetrain config`, or "
            f"pass another --config_file."
        )
        return False
    launch_config.save(basic_config(mixed_precision.lower()), path)
    return path


def run_config_default(args: argparse.Namespace) -> int:
    written = write_basic_config(args.mixed_precision, args.config_file)
    if written:
        print(
            f"drivetrain config default: wrote {written}; `drivetrain launch` reads it"
            + ("" if args.config_file is None else f" with --config_file {written}")
        )
    return 0
