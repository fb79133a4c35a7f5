"""The Trainer's preemption handling: stop on a signal, save, exit; resume on the next start.

During ``fit`` the Trainer watches ``SIGTERM`` and the cluster environment's requeue signal
(``SLURMEnvironment(auto_requeue=True)``: ``SIGUSR1`` by default). When one arrives, on any rank,
every rank stops at the same step boundary (:mod:`drivetrain.strategies.preemption`), the
Trainer saves ``<default_root_dir>/hpc_ckpt_<N>.ckpt`` through the core checkpoint module (written,
verified, then published), global rank 0 asks the cluster to requeue the job when the signal was
the requeue signal, and :class:`~drivetrain.strategies.preemption.Preempted` ends the program with
exit code ``128 + signal``.

The next ``fit`` without ``ckpt_path`` (or with ``ckpt_path="hpc"``) in the same
``default_root_dir`` resumes from the newest ``hpc_ckpt_<N>.ckpt``, at the step it stopped at.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from drivetrain._utilities import paths
from drivetrain._utilities.log import get_logger
from drivetrain.plugins.io.atomic import resolve
from drivetrain.strategies.preemption import Preempted, signal_name

if TYPE_CHECKING:
    from drivetrain.strategies.preemption import PreemptionWatch
    from drivetrain.trainer.state import FitProgress
    from drivetrain.trainer.trainer import Trainer

_log = get_logger(__name__)
_HPC = re.compile(r"hpc_ckpt_(\d+)\.ckpt")


def stop_signals(trainer: Trainer) -> tuple[int, ...]:
    """``SIGTERM``, and the cluster environment's requeue signal when it has one."""
    environment = getattr(trainer.strategy, "cluster_environment", None)
    requeue = environment.requeue_signal if environment is not None else None
    return (signal.SIGTERM,) if requeue is None else (signal.SIGTERM, requeue)


@contextmanager
def watching(trainer: Trainer, progress: FitProgress) -> Iterator[PreemptionWatch]:
    """Watch for stop signals while the fit loop runs (handlers only in the main thread)."""
    watch = trainer.strategy.preemption_watch(stop_signals(trainer), lambda: progress.total_batches)
    if not watch.install() and not watch.can_agree and trainer.is_global_zero:
        _log.warning(
            f"[drivetrain] {type(trainer.strategy).__name__} has no rendezvous store for the ranks to agree on a "
            f"stop step, so a SIGTERM ends this fit without a preemption checkpoint (save with ModelCheckpoint)."
        )
    try:
        yield watch
    finally:
        watch.uninstall()  # strategy.preemption stays: launchers read whether this rank stopped


def stop(trainer: Trainer, watch: PreemptionWatch) -> None:
    """Save the checkpoint to resume from, requeue when asked to, and end the program (every rank)."""
    signum = watch.signum or signal.SIGTERM
    path = _next_checkpoint(trainer) if trainer.is_global_zero else None
    if trainer.world_size > 1:
        path = trainer.strategy.broadcast(path)
    assert path is not None
    trainer.save_checkpoint(path)
    environment = getattr(trainer.strategy, "cluster_environment", None)
    requeue = environment is not None and environment.requeue_signal == signum
    if trainer.is_global_zero:
        _log.warning(
            f"[drivetrain] {signal_name(signum)}: stopped at step {trainer.global_step} and saved {path}"
            + (
                "; requeuing the job."
                if requeue
                else "; the next fit() in this default_root_dir resumes from it."
            )
        )
        if requeue:
            assert environment is not None
            environment.requeue()
    raise Preempted(signum, path)


def newest_checkpoint(directory: str) -> str | None:
    """The ``hpc_ckpt_<N>.ckpt`` in ``directory`` (local or remote) with the largest ``N``."""
    found = _numbered(directory)
    return paths.join(directory, f"hpc_ckpt_{max(found)}.ckpt") if found else None


def _next_checkpoint(trainer: Trainer) -> str:
    directory = trainer.default_root_dir
    paths.makedirs(directory)
    return paths.join(directory, f"hpc_ckpt_{max(_numbered(directory), default=0) + 1}.ckpt")


def _numbered(directory: str) -> list[int]:
    return [
        int(match.group(1))
        for name in paths.listdir(directory)
        if (match := _HPC.fullmatch(name)) and resolve(paths.join(directory, name)) is not None
    ]
