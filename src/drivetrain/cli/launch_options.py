"""``accelerate launch``'s options beyond the process counts, as ``drivetrain launch`` honours them.

Each option is either passed to torchrun (``--monitor_interval``, ``--tee``, ``--log_dir``,
``--no_python``, ``--enable_cpu_affinity`` as torchrun's ``--numa-binding node``), set in the
ranks' environment as Accelerate sets it (``--gpu_ids``, ``--num_cpu_threads_per_process``,
``--debug``, ``--downcast_bf16``), or changes what the ranks run (``--main_training_function``).
``--use_deepspeed``/``--use_fsdp``/``--use_megatron_lm`` are refused with the strategy the
script passes instead: in drivetrain the script chooses the strategy. The launch command itself
(:mod:`drivetrain.cli.launch`) calls :func:`add_accelerate_options` and
:func:`apply_accelerate_options`.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import sys
from typing import Any

#: What the script passes instead of ``accelerate launch --use_<x>``.
_STRATEGY_FLAGS = {
    "use_deepspeed": "strategy='deepspeed' (or 'deepspeed_stage_2', 'deepspeed_stage_3_offload' …)",
    "use_fsdp": "strategy='fsdp' (or 'fsdp_cpu_offload', or an FSDPStrategy(...))",
    "use_megatron_lm": "strategy='model_parallel' (drivetrain has no Megatron-LM integration)",
}


def add_accelerate_options(parser: argparse.ArgumentParser) -> None:
    """Add Accelerate's launch options (both spellings, ``--x_y`` and ``--x-y``)."""

    def flag(name: str, help_text: str, **kwargs: Any) -> None:
        spellings = [f"--{name}"] + ([f"--{name.replace('_', '-')}"] if "_" in name else [])
        parser.add_argument(*spellings, dest=name, help=help_text, **kwargs)

    flag(
        "same_network",
        "several machines on one network: rendezvous at --main_process_ip/port directly (static); without it "
        "the address is the endpoint of --rdzv_backend's rendezvous",
        action="store_true",
        default=None,
    )
    flag("gpu_ids", "the GPUs of this machine to use, by id: '0,1' (default all)", default=None)
    flag(
        "num_cpu_threads_per_process",
        "CPU threads of each process (OMP_NUM_THREADS; default: the cores shared out)",
        type=int,
        default=None,
    )
    flag(
        "enable_cpu_affinity",
        "bind each process to the CPUs of its NVIDIA GPU's NUMA node (torchrun --numa-binding node)",
        action="store_true",
        default=None,
    )
    flag(
        "debug",
        "check that all processes call each collective alike (the script's Accelerator's debug mode)",
        action="store_true",
        default=None,
    )
    flag("tee", "copy the ranks' output into --log_dir's files as well: 0 none, 1 stdout, 2 stderr, 3 both")
    flag("log_dir", "folder for the ranks' output files (torchrun's --log-dir)")
    flag("no_python", "run the script as a program itself, without `python`", action="store_true")
    parser.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        help="on a failure, print only the failing rank's own error and drivetrain's summary (not torchrun's report)",
    )
    flag(
        "main_training_function",
        "call this function of the script in every process (the script is imported, not run as __main__)",
        default=None,
    )
    flag(
        "downcast_bf16",
        "TPUs with bf16: float32 as bfloat16, float64 as float32 (torch_xla's XLA_DOWNCAST_BF16)",
        action="store_true",
        default=None,
    )
    for name, instead in _STRATEGY_FLAGS.items():
        flag(name, f"Accelerate's; in drivetrain the script chooses: {instead}", action="store_true")


def _fail(message: str) -> None:
    raise SystemExit(f"drivetrain launch: {message}")


def check_accelerate_options(args: argparse.Namespace) -> None:
    """Refuse what cannot be honoured, before anything starts."""
    chosen = [name for name in _STRATEGY_FLAGS if getattr(args, name, False)]
    if chosen:
        _fail(
            "; ".join(
                f"--{name} is chosen by the script in drivetrain: {_STRATEGY_FLAGS[name]}" for name in chosen
            )
            + ". Pass it to drivetrain.Accelerator(...) or Trainer(...) and launch without the flag."
        )
    if args.no_python and (args.module or args.main_training_function not in (None, "main")):
        _fail(
            "--no_python runs the script as a program: it cannot be combined with -m or --main_training_function."
        )
    if args.num_cpu_threads_per_process is not None and args.num_cpu_threads_per_process < 1:
        _fail(f"--num_cpu_threads_per_process must be at least 1, got {args.num_cpu_threads_per_process}.")
    if args.main_training_function is not None and not args.main_training_function.isidentifier():
        _fail(f"--main_training_function must be a function's name, got {args.main_training_function!r}.")
    if args.tee is not None and not _is_stream_choice(args.tee):
        _fail(
            f"--tee takes 0 (none), 1 (stdout), 2 (stderr), 3 (both) or per rank 'RANK:N,…', got {args.tee!r}."
        )
    if args.gpu_ids is not None:
        from drivetrain.cli.launch_config import check_value

        try:
            check_value("gpu_ids", str(args.gpu_ids), "--gpu_ids")
        except ValueError as error:
            _fail(str(error))


def _is_stream_choice(value: str) -> bool:
    parts = [part.partition(":") for part in value.split(",")]
    if len(parts) == 1 and not parts[0][1]:
        return value in ("0", "1", "2", "3")
    return all(rank.isdigit() and sep and stream in ("0", "1", "2", "3") for rank, sep, stream in parts)


def ranks_environment(args: argparse.Namespace, nproc_per_node: int) -> dict[str, str]:
    """The variables Accelerate's options set for the ranks (as ``accelerate launch`` sets them)."""
    variables: dict[str, str] = {}
    if args.gpu_ids not in (None, "all"):
        # Intel GPUs take the same list through Level Zero's mask; everything else through CUDA's.
        name = "ZE_AFFINITY_MASK" if args.accelerator == "xpu" else "CUDA_VISIBLE_DEVICES"
        variables[name] = str(args.gpu_ids)
    if args.num_cpu_threads_per_process is not None:
        variables["OMP_NUM_THREADS"] = str(args.num_cpu_threads_per_process)
    if args.debug:
        variables["ACCELERATE_DEBUG_MODE"] = "true"
    if args.downcast_bf16:
        variables["XLA_DOWNCAST_BF16"] = "1"
        variables["XLA_USE_BF16"] = "0"
        if args.accelerator not in ("tpu", "xla"):
            print(
                "drivetrain launch: --downcast_bf16 is read by torch_xla only (TPUs, with --accelerator tpu); "
                "it changes nothing on other hardware.",
                file=sys.stderr,
                flush=True,
            )
    return variables


def torchrun_options(args: argparse.Namespace) -> list[str]:
    """torchrun's own arguments for Accelerate's options."""
    options = []
    if args.monitor_interval is not None:
        options.append(f"--monitor-interval={args.monitor_interval}")
    if args.tee is not None:
        options.append(f"--tee={args.tee}")
    if args.log_dir is not None:
        options.append(f"--log-dir={args.log_dir}")
    if args.no_python:
        options.append("--no-python")
    if args.enable_cpu_affinity:
        from drivetrain.accelerators import CUDAAccelerator

        if CUDAAccelerator.is_available():
            options.append("--numa-binding=node")
        else:
            print(
                "drivetrain launch: --enable_cpu_affinity binds each process to the CPUs of its NVIDIA GPU's NUMA "
                "node; there is no NVIDIA GPU here, so the processes run unbound (as with Accelerate).",
                file=sys.stderr,
                flush=True,
            )
    return options


def program(args: argparse.Namespace) -> list[str]:
    """What each rank runs: the script (or module, or program), or a function of it."""
    if args.main_training_function not in (None, "main"):
        return [
            "-m",
            "drivetrain.cli.run_function",
            *(["--module"] if args.module else []),
            args.script,
            args.main_training_function,
            *args.script_args,
        ]
    return [*(["-m"] if args.module else []), args.script, *args.script_args]


def script_exists(args: argparse.Namespace) -> bool:
    if args.module:
        return True
    if args.no_python:
        return os.path.exists(args.script) or shutil.which(args.script) is not None
    return os.path.exists(args.script)


def apply_accelerate_options(args: argparse.Namespace, nproc_per_node: int) -> None:
    """Set the ranks' variables in this process's environment (torchrun passes it on) and quiet torchrun."""
    os.environ.update(ranks_environment(args, nproc_per_node))
    if args.quiet:
        # torchrun's agent logs every worker's failure with its own report; drivetrain's summary and
        # the failing rank's traceback (on its stderr) remain.
        logging.getLogger("torch.distributed.elastic").setLevel(logging.CRITICAL)
