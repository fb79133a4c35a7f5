"""Ranks that disagree about a collective get an error that names them, instead of a hang or a wrong result.

Real 2-process gloo jobs (forked ranks, each building its own Trainer or Accelerator).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from helpers.multiprocess import RankFailed, run_processes
from trainer.trainer_models import Regression, loader, quiet_trainer

pytestmark = [pytest.mark.multiprocess, pytest.mark.faults]

#: As under torchrun: the test's parent hosts the rendezvous store (its agent), and the strategy in
#: each rank sets up the process group itself.
TORCHRUN = {"TORCHELASTIC_RUN_ID": "faults", "TORCHELASTIC_USE_AGENT_STORE": "True", "GROUP_RANK": "0"}


def _run(function: Any, timeout: float = 60) -> list[Any]:
    return run_processes(function, 2, process_group=False, env=TORCHRUN, timeout=timeout)


class PerRankMetric(Regression):
    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        loss = super().training_step(batch, batch_idx)
        self.log(f"accuracy_rank{self.global_rank}", 1.0 + self.global_rank, sync_dist=True)
        return loss


def _log_a_different_name_per_rank(rank: int, world: int) -> None:
    quiet_trainer(strategy="ddp", devices=2, max_steps=2).fit(PerRankMetric(), loader())


def test_synced_metrics_with_different_names_per_rank_are_refused() -> None:
    with pytest.raises(RankFailed) as failure:
        _run(_log_a_different_name_per_rank)
    message = str(failure.value)
    assert "the ranks log different names at the same point (rank 0: 'accuracy_rank0'; rank 1: " in message
    assert "'accuracy_rank1'), so different metrics would be averaged together" in message
