"""examples/model_parallel_gpt.py: tp=2 x dp_shard=2 on 4 CPU processes it starts itself, through each door.

Both doors train the same model on the same batches with the same layout, so rank 0's loss
curves must agree (the doors differ only in who applies the plan and how FSDP groups blocks),
and the loss must fall.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from helpers.scripts import run_script

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(480)]

EXAMPLE = Path(__file__).parents[2] / "examples" / "model_parallel_gpt.py"


def test_both_doors_train_the_gpt_example_on_a_2d_mesh_alike(tmp_path: Path) -> None:
    curves = {}
    for door in ("trainer", "accelerator"):
        out = tmp_path / f"{door}.json"
        result = run_script([str(EXAMPLE), "--door", door, "--steps", "6", "--out", str(out)], timeout=220)
        assert result.returncode == 0, result.stderr
        assert f"{door}: loss" in result.stdout
        curves[door] = json.loads(out.read_text())["losses"]
    assert len(curves["trainer"]) == len(curves["accelerator"]) == 6
    assert curves["trainer"] == pytest.approx(curves["accelerator"], abs=1e-4)
    assert curves["trainer"][-1] < curves["trainer"][0]


@pytest.mark.cuda
@pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs 2 or more CUDA GPUs"
)
def test_both_doors_train_the_gpt_example_with_tensor_parallel_on_gpus(tmp_path: Path) -> None:
    gpus = torch.cuda.device_count() // 2 * 2
    curves = {}
    for door in ("trainer", "accelerator"):
        out = tmp_path / f"{door}.json"
        command = [str(EXAMPLE), "--door", door, "--accelerator", "cuda", "--devices", str(gpus), "--tp", "2"]
        result = run_script([*command, "--steps", "6", "--out", str(out)], timeout=300)
        assert result.returncode == 0, result.stderr
        curves[door] = json.loads(out.read_text())["losses"]
    assert curves["trainer"] == pytest.approx(curves["accelerator"], abs=1e-3)  # TF32/NCCL reduction order
    assert curves["trainer"][-1] < curves["trainer"][0]
