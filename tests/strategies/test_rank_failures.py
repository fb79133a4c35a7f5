"""Which rank a failed job names as the cause, when more than one rank fails (``ddp_fork`` jobs).

Each rank records why it leaves (``drivetrain.strategies.rank_failures``); the launcher names the
rank that failed first with an error of its own, never one that only lost its peer.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
import torch

import drivetrain as dt
from drivetrain.strategies.launchers import ProcessFailedError
from drivetrain.trainer import Callback
from trainer.trainer_models import Regression, loader, quiet_trainer

pytestmark = pytest.mark.multiprocess

#: The longest a rank waits for its peer (a bound, never reached when the job behaves).
WAIT_SECONDS = 60


def _wait_for(path: Path) -> None:
    deadline = time.monotonic() + WAIT_SECONDS
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.01)


class Recorded(Callback):
    """Marks that this rank's failure is recorded (the Trainer records it before these hooks run) and,
    with ``wait``, waits for the other rank's mark: both records then exist before either process
    ends, so the launcher never stops a rank before it could say why it failed."""

    def __init__(self, folder: Path, wait: bool) -> None:
        self.folder = folder
        self.wait = wait

    def on_exception(self, trainer: dt.Trainer, module: Any, exception: BaseException) -> None:
        (self.folder / f"recorded-{trainer.global_rank}").touch()
        if self.wait:
            _wait_for(self.folder / f"recorded-{1 - trainer.global_rank}")


class OwnErrors(Regression):
    """Rank 1 raises at batch 2; rank 0 raises its own error there too, once rank 1's failure is recorded."""

    def __init__(self, folder: Path) -> None:
        super().__init__()
        self.folder = folder

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        if batch_idx == 2:
            if self.global_rank == 1:
                raise RuntimeError("rank 1 fails first")
            _wait_for(self.folder / "recorded-1")
            raise RuntimeError("rank 0 fails second")
        return super().training_step(batch, batch_idx)


class DiesSilently(Regression):
    """At batch 2 rank 1 ends without a word, as a crash in native code would; rank 0 then loses it in
    the all-reduce. Rank 0 ignores the launcher's SIGTERM, so it always gets to record that failure (in
    a real job it may or may not, depending on which comes first)."""

    def setup(self, stage: str) -> None:
        if self.global_rank == 0:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        if batch_idx == 2 and self.global_rank == 1:
            os._exit(3)
        return super().training_step(batch, batch_idx)


def test_of_two_ranks_that_raise_their_own_errors_the_first_is_named(tmp_path: Path) -> None:
    trainer = quiet_trainer(
        strategy="ddp_fork", devices=2, max_epochs=1, callbacks=[Recorded(tmp_path, True)]
    )
    with pytest.raises(ProcessFailedError) as failure:
        trainer.fit(OwnErrors(tmp_path), loader())
    message = str(failure.value)
    assert message.startswith("rank 1 (pid "), message
    assert "RuntimeError: rank 1 fails first" in message and "rank 0 fails second" not in message
    assert failure.value.rank == 1


def test_a_rank_that_only_lost_its_peer_is_not_named_as_the_cause(tmp_path: Path) -> None:
    trainer = quiet_trainer(
        strategy="ddp_fork", devices=2, max_epochs=1, callbacks=[Recorded(tmp_path, False)]
    )
    with pytest.raises(ProcessFailedError) as failure:
        trainer.fit(DiesSilently(), loader())
    # Rank 0 failed too, with a broken connection in its all-reduce, and recorded it.
    assert (tmp_path / "recorded-0").exists()
    assert str(failure.value).startswith("rank 1 (pid "), str(failure.value)
    assert "exited with code 3" in str(failure.value)
    assert (failure.value.rank, failure.value.exit_code) == (1, 3)
