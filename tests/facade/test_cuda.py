"""drivetrain.Accelerator on a real CUDA GPU; skipped where CUDA is absent."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import drivetrain as dt
from drivetrain.utils import set_seed
from helpers.scripts import REPO, run_script

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def _train(accelerator: dt.Accelerator) -> tuple[nn.Module, list[float]]:
    set_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x = torch.randn(256, 8)
    data = TensorDataset(x, x.sum(dim=1, keepdim=True))  # learnable, so the loss must fall
    model, optimizer, loader = accelerator.prepare(
        model, optimizer, DataLoader(data, batch_size=8, shuffle=True)
    )
    losses = []
    for x, y in loader:
        assert x.device.type == "cuda" and y.device.type == "cuda"
        loss = nn.functional.mse_loss(model(x), y)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return model, losses


def test_auto_picks_the_gpu_and_places_model_and_batches() -> None:
    accelerator = dt.Accelerator(devices=1)  # "auto" on a multi-GPU machine would start processes
    assert accelerator.device.type == "cuda" and accelerator.distributed_type.value == "NO"
    model, losses = _train(accelerator)
    assert next(model.parameters()).device.type == "cuda"
    assert sum(losses[-4:]) < 0.75 * sum(losses[:4])


@pytest.mark.parametrize("mixed_precision", ["fp16", "bf16"])
def test_mixed_precision_on_the_gpu(mixed_precision: str) -> None:
    accelerator = dt.Accelerator(devices=1, mixed_precision=mixed_precision)
    model, losses = _train(accelerator)
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert model(torch.randn(2, 8, device="cuda")).dtype == torch.float32
    with accelerator.autocast():
        inner = accelerator.unwrap_model(model, keep_fp32_wrapper=False)
        expected = torch.float16 if mixed_precision == "fp16" else torch.bfloat16
        assert inner(torch.randn(2, 8, device="cuda")).dtype == expected
    if mixed_precision == "fp16":
        assert accelerator.strategy.precision.scaler is not None
    assert sum(losses[-4:]) < 0.75 * sum(losses[:4])


def test_state_round_trip_on_the_gpu(tmp_path: Path) -> None:
    accelerator = dt.Accelerator(devices=1, mixed_precision="fp16")
    model, _ = _train(accelerator)
    accelerator.save_state(tmp_path)
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.zero_()
    accelerator.load_state(tmp_path)
    for name, value in model.state_dict().items():
        assert value.device.type == "cuda" and torch.equal(value, saved[name])


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_two_gpus_in_a_plain_script_start_their_own_processes() -> None:
    result = run_script([str(REPO / "tests" / "facade" / "scripts" / "two_gpus.py")], timeout=300)
    assert result.returncode == 0, result.stderr
    for rank in range(2):
        assert f"ranks=2 device=cuda:{rank} total=2.0 gathered=[0, 1]" in result.stdout
