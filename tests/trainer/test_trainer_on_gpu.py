"""The Trainer on a real GPU: the seeds' accelerator="gpu" examples; skipped where CUDA is absent."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from trainer.trainer_models import Regression, loader, quiet_trainer, regression_data

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

SCRIPT = str(Path(__file__).parent / "scripts" / "gpu_trainers.py")


class OnDevice(Regression):
    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        assert batch[0].device.type == "cuda" and self.device.type == "cuda"
        return super().training_step(batch, batch_idx)


@pytest.mark.parametrize("precision", ["32-true", "16-mixed", "bf16-mixed"])
def test_fit_on_one_gpu_moves_batches_and_learns(precision: str) -> None:
    if precision == "bf16-mixed" and not torch.cuda.is_bf16_supported():
        pytest.skip("this GPU has no bfloat16")
    model = OnDevice(lr=0.05)
    data = loader(regression_data(256), batch_size=32, shuffle=True)
    before = quiet_trainer(accelerator="gpu").validate(model, data, verbose=False)[0]["val_loss"]
    trainer = quiet_trainer(accelerator="gpu", devices=1, precision=precision, max_epochs=5)
    trainer.fit(model, data, data)
    assert next(model.parameters()).device.type == "cuda"
    assert float(trainer.callback_metrics["val_loss"]) < before / 2
    assert trainer.precision == precision


@pytest.mark.multiprocess
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
@pytest.mark.parametrize("case", ["static_graph", "custom_io"])
def test_seed_ddp_examples_on_gpus(case: str, tmp_path: Path) -> None:
    from helpers.scripts import run_script

    result = run_script([SCRIPT, case, str(tmp_path)], timeout=300)
    assert result.returncode == 0, result.stderr
    lines = sorted(line for line in result.stdout.splitlines() if line.startswith("rank="))
    assert len(lines) == min(torch.cuda.device_count(), 4 if case == "static_graph" else 2)
    assert all("device=cuda" in line and "finished=True" in line for line in lines)
