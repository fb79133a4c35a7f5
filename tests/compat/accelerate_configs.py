"""Launch configuration files written by the installed Accelerate's own ``accelerate config`` code.

    python accelerate_configs.py --package SITE/accelerate --out DIR

writes one file per setup of :data:`SETUPS` into ``DIR``: ``default.yaml`` from ``accelerate
config default`` (its ``write_basic_config``), the others from the ``accelerate config``
questionnaire (``config_command``) given the answers listed here, as a user types them. The
questionnaire's menus read their choice as a number when they cannot draw themselves (Accelerate's
notebook mode, switched on here), so every answer is a line of standard input; Enter (an empty
line) takes the default as it does for a person.

It runs the real ``accelerate`` package (pinned in ``constraints.txt``, from the conformance
environment, :mod:`accelerate_package`) on this interpreter's torch, in a process of its own: no
drivetrain import hook is installed here. :func:`generate` is what tests call.
"""

from __future__ import annotations

import argparse
import builtins
import contextlib
import io
import subprocess
import sys
from pathlib import Path

#: setup -> the answers to the questionnaire, in the order it asks (menus: the choice's number).
SETUPS: dict[str, tuple[str, ...]] = {
    "cpu": (
        "0",  # compute environment: This machine
        "0",  # machine type: No distributed training
        "yes",  # run on the CPU only
        "no",  # torch dynamo
        "no",  # DeepSpeed
        "0",  # mixed precision: no
    ),
    "multi_cpu": (
        "0",  # This machine
        "1",  # multi-CPU
        "1",  # machines
        "no",  # check distributed operations (debug)
        "no",  # launch mpirun
        "no",  # torch dynamo
        "2",  # processes
        "0",  # mixed precision: no
    ),
    "multi_cpu_debug_bf16": (
        "0",  # This machine
        "1",  # multi-CPU
        "1",  # machines
        "yes",  # check distributed operations (debug)
        "no",  # launch mpirun
        "no",  # torch dynamo
        "2",  # processes
        "2",  # mixed precision: bf16
    ),
    "multi_gpu": (
        "0",  # This machine
        "4",  # multi-GPU
        "1",  # machines
        "no",  # debug
        "no",  # torch dynamo
        "no",  # DeepSpeed
        "no",  # FullyShardedDataParallel
        "no",  # Megatron-LM
        "2",  # GPUs
        "all",  # which GPUs
        "no",  # NUMA efficiency
        "1",  # mixed precision: fp16
    ),
    "fsdp": (
        "0",  # This machine
        "4",  # multi-GPU
        "1",  # machines
        "no",  # debug
        "no",  # torch dynamo
        "no",  # DeepSpeed
        "yes",  # FullyShardedDataParallel
        "",  # FSDP version (default: 2)
        "",  # reshard after forward
        "",  # offload parameters
        "",  # auto wrap policy (default: transformer based)
        "",  # use the model's _no_split_modules
        "",  # transformer layer classes
        "",  # state dict type
        "",  # CPU RAM efficient loading
        "",  # activation checkpointing
        "no",  # parallelism config
        "2",  # GPUs
        "2",  # mixed precision: bf16
    ),
    "deepspeed": (
        "0",  # This machine
        "4",  # multi-GPU
        "1",  # machines
        "no",  # debug
        "no",  # torch dynamo
        "yes",  # DeepSpeed
        "no",  # a DeepSpeed json file
        "2",  # ZeRO stage 2
        "0",  # offload optimizer: none
        "0",  # offload parameters: none
        "1",  # gradient accumulation steps
        "no",  # gradient clipping
        "no",  # deepspeed.zero.Init
        "no",  # Mixture-of-Experts
        "2",  # GPUs
        "2",  # mixed precision: bf16
    ),
}


class _Answers:
    """``input`` for the questionnaire: the next scripted answer; running out is an error, not a hang."""

    def __init__(self, answers: tuple[str, ...]) -> None:
        self.answers = list(answers)
        self.asked: list[str] = []

    def __call__(self, prompt: object = "") -> str:
        self.asked.append(str(prompt))
        if not self.answers:
            raise RuntimeError(
                f"accelerate config asked more than the {len(self.asked) - 1} scripted answers; last question: "
                f"{prompt!r}"
            )
        return self.answers.pop(0)


def _questionnaire(answers: tuple[str, ...], path: Path) -> None:
    from accelerate.commands.config.config import config_command
    from accelerate.commands.menu import selection_menu

    selection_menu.in_colab = True  # menus read their choice as a number, from input()
    scripted = _Answers(answers)
    builtins.input = scripted  # type: ignore[assignment]
    with contextlib.redirect_stdout(io.StringIO()):  # the menus' cursor movements
        config_command(argparse.Namespace(config_file=str(path)))
    if scripted.answers:
        raise RuntimeError(
            f"accelerate config left {len(scripted.answers)} scripted answer(s) unused: {scripted.answers}"
        )


def write(out: Path) -> None:
    from accelerate.commands.config.default import write_basic_config

    out.mkdir(parents=True, exist_ok=True)
    with contextlib.redirect_stdout(io.StringIO()):
        written = write_basic_config(save_location=str(out / "default.yaml"))
    if not written:
        raise RuntimeError(f"accelerate config default wrote nothing to {out / 'default.yaml'}")
    for name, answers in SETUPS.items():
        _questionnaire(answers, out / f"{name}.yaml")


def generate(package: Path, out: Path, timeout: float = 300) -> dict[str, Path]:
    """Write the files into ``out`` with Accelerate's code (``package``: the installed ``accelerate`` folder).

    Returns the setup name -> file (``"default"`` and every name of :data:`SETUPS`).
    """
    completed = subprocess.run(
        [sys.executable, __file__, "--package", str(package), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if completed.returncode != 0:
        raise RuntimeError(
            f"accelerate's config code failed:\n{completed.stdout[-3000:]}\n{completed.stderr[-6000:]}"
        )
    return {name: out / f"{name}.yaml" for name in ("default", *SETUPS)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--package", type=Path, required=True, help="the installed accelerate package directory"
    )
    parser.add_argument("--out", type=Path, required=True, help="the folder for the files")
    args = parser.parse_args()
    sys.path.append(str(args.package.parent))  # after this interpreter's own packages (its torch)
    write(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
