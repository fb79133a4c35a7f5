"""Preemption in one process: the watch, the front doors' settings and their errors (the signal paths across
processes are in tests/faults/test_preemption.py)."""

from __future__ import annotations

import gc
import signal
import subprocess
import sys
import weakref
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import drivetrain as dt
from drivetrain.plugins.environments import LocalEnvironment, SLURMEnvironment
from drivetrain.strategies.preemption import Preempted, PreemptionWatch


def test_a_signal_stops_a_one_process_run_at_the_next_boundary_and_is_not_swallowed_after() -> None:
    seen: list[int] = []
    previous = signal.signal(signal.SIGUSR2, lambda signum, frame: seen.append(signum))
    try:
        steps = [0]
        watch = PreemptionWatch([signal.SIGUSR2], lambda: steps[0])
        assert watch.install()
        assert not watch.pending
        signal.raise_signal(signal.SIGUSR2)
        assert watch.pending and watch.signum == signal.SIGUSR2
        assert seen == [signal.SIGUSR2]  # the handler that was there runs too
        assert watch.stop_here() and watch.stopping
        watch.uninstall()
        assert seen == [signal.SIGUSR2]  # acted on: not delivered again

        late = PreemptionWatch([signal.SIGUSR2], lambda: steps[0])
        late.install()
        signal.raise_signal(signal.SIGUSR2)  # after the last boundary: the run never stops for it
        late.uninstall()
        assert seen == [signal.SIGUSR2, signal.SIGUSR2, signal.SIGUSR2]  # ...so the old handler gets it again
        assert signal.getsignal(signal.SIGUSR2) is not late._handle
    finally:
        signal.signal(signal.SIGUSR2, previous)


def test_several_processes_without_a_store_to_agree_through_install_nothing() -> None:
    watch = PreemptionWatch([signal.SIGUSR2], int, store=None, world_size=2)
    assert not watch.can_agree
    assert not watch.install()  # one rank stopping alone would leave the others in its collectives
    assert signal.getsignal(signal.SIGUSR2) is not watch._handle


def test_preempted_ends_the_program_with_128_plus_the_signal() -> None:
    stopped = Preempted(signal.SIGTERM, "/ckpt/hpc_ckpt_1.ckpt")
    assert isinstance(stopped, SystemExit) and stopped.code == 143
    assert str(stopped) == "stopped by SIGTERM; checkpoint saved to /ckpt/hpc_ckpt_1.ckpt"
    assert Preempted(signal.SIGUSR1).code == 138


def test_slurm_requeue_settings() -> None:
    assert SLURMEnvironment().requeue_signal == signal.SIGUSR1  # Lightning's defaults: on, SIGUSR1
    assert SLURMEnvironment(requeue_signal=signal.SIGTERM).requeue_signal == signal.SIGTERM
    assert SLURMEnvironment(auto_requeue=False).requeue_signal is None
    with pytest.raises(ValueError, match=r"requeue_signal=.*SIGKILL.* is not a signal a process can handle"):
        SLURMEnvironment(requeue_signal=signal.SIGKILL)
    with pytest.raises(TypeError, match="auto_requeue"):
        SLURMEnvironment(auto_requeue="yes")  # type: ignore[arg-type]


def test_a_one_device_trainer_honours_a_given_cluster_environment() -> None:
    environment = LocalEnvironment()  # e.g. SLURMEnvironment(auto_requeue=True) inside a SLURM job
    trainer = dt.Trainer(accelerator="cpu", devices=1, plugins=[environment], logger=False)
    assert trainer.strategy.cluster_environment is environment


def test_ckpt_path_hpc_without_a_preemption_checkpoint_is_an_error(tmp_path: Path) -> None:
    class Model(dt.TrainingModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = nn.Linear(2, 1)

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            return self.layer(batch).sum()

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    trainer = dt.Trainer(
        accelerator="cpu", max_steps=1, default_root_dir=tmp_path, logger=False, enable_progress_bar=False
    )
    with pytest.raises(
        ValueError, match=r"ckpt_path='hpc' resumes from the newest hpc_ckpt_<N>.ckpt.*there is none"
    ):
        trainer.fit(Model(), torch.utils.data.DataLoader(torch.ones(4, 2)), ckpt_path="hpc")


def test_the_accelerator_checks_its_preemption_calls() -> None:
    accelerator = dt.Accelerator(cpu=True)
    with pytest.raises(RuntimeError, match=r"check_preemption\(\) needs handle_preemption\(\) first"):
        accelerator.check_preemption()
    with pytest.raises(ValueError, match=r"SIGKILL and SIGSTOP cannot be caught"):
        accelerator.handle_preemption(signals=[signal.SIGKILL])
    previous = signal.getsignal(signal.SIGUSR2)
    try:
        accelerator.handle_preemption(signals=[signal.SIGUSR2])
        with pytest.raises(RuntimeError, match="already called"):
            accelerator.handle_preemption(signals=[signal.SIGUSR2])
        assert accelerator.check_preemption() is False
        with pytest.raises(
            RuntimeError, match=r"end_preempted\(\) ends a run that check_preemption\(\) stopped"
        ):
            accelerator.end_preempted()
        signal.raise_signal(signal.SIGUSR2)
        assert accelerator.check_preemption() is True
        with pytest.raises(Preempted) as stopped:
            accelerator.end_preempted("somewhere")
        assert stopped.value.code == 128 + signal.SIGUSR2
    finally:
        assert accelerator._preemption is not None
        accelerator._preemption.uninstall()
        signal.signal(signal.SIGUSR2, previous)


def test_an_accelerator_watching_for_preemption_is_freed_with_its_handlers_when_dropped() -> None:
    previous = signal.getsignal(signal.SIGUSR2)
    accelerator = dt.Accelerator(cpu=True)
    accelerator.handle_preemption(signals=[signal.SIGUSR2])
    assert signal.getsignal(signal.SIGUSR2) is not previous
    gone = weakref.ref(accelerator)
    del accelerator
    gc.collect()
    # Neither the signal table nor the exit handlers keep the Accelerator (and its model) alive,
    # and the handler it installed does not outlive it.
    assert gone() is None
    assert signal.getsignal(signal.SIGUSR2) is previous


#: Runs the stop signal's handler at every line the watch (and what it calls) runs while it is installed
#: and uninstalled, as Python runs a handler: on the main thread between two bytecodes,
#: inside whatever that line holds (an Event's lock in the middle of set(), for one). A signal raised
#: for real is handled only once tracing ends, so the handler is called from the trace function.
_SIGNAL_AT_EVERY_LINE = """
import signal, sys
import torch.distributed as dist
from drivetrain.strategies.preemption import PreemptionWatch

signal.signal(signal.SIGUSR2, lambda signum, frame: None)  # the handler the watch finds and chains to
fired = []

def tracer(frame, event, arg):
    if event == "line":
        handler = signal.getsignal(signal.SIGUSR2)
        if callable(handler):
            fired.append(frame.f_lineno)
            handler(signal.SIGUSR2, frame)
    return tracer

for store, world_size in ((None, 1), (dist.HashStore(), 2)):
    watch = PreemptionWatch([signal.SIGUSR2], lambda: 0, store, "job", 0, world_size)
    fired.clear()
    sys.settrace(tracer)
    watch.install()
    watch.uninstall()
    sys.settrace(None)
    assert watch.pending and watch.signum in (None, signal.SIGUSR2), vars(watch)
    print(world_size, len(fired), "handler calls")
"""


def test_a_stop_signal_at_any_line_of_installing_or_removing_the_watch_never_deadlocks(
    tmp_path: Path,
) -> None:
    # The handler used to wake the watcher thread with an Event, whose lock the main thread holds inside
    # uninstall's own set(): a SIGTERM landing there (the launcher stopping the ranks after one died)
    # left the rank waiting on itself forever, until the launcher killed it unrecorded.
    script = tmp_path / "signal_everywhere.py"
    script.write_text(_SIGNAL_AT_EVERY_LINE)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    # The handler ran at every line, for both watches (one process; two ranks with a watcher thread).
    calls = dict(line.split()[:2] for line in done.stdout.splitlines() if line.endswith("handler calls"))
    assert set(calls) == {"1", "2"} and min(int(n) for n in calls.values()) > 50, done.stdout
