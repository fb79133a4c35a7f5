"""Accelerate's modeling utilities (``accelerate.utils.modeling``) give what the pinned Accelerate gives.

Each case of ``modeling_cases.py`` (device maps with tied weights, buffers and empty GPUs, balanced
budgets, sizes, tied-parameter groups …) is computed by drivetrain here and by the pinned
Accelerate in a process of its own; results and the number of warnings must agree.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import drivetrain.utils.modeling as drivetrain_modeling
from drivetrain.utils import (
    convert_file_size_to_int,
    offload_state_dict,
    retie_parameters,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "compat"))
sys.path.insert(0, str(Path(__file__).parent))

import accelerate_package
import modeling_cases


@pytest.fixture(scope="module")
def accelerate_results() -> dict[str, Any]:
    package = accelerate_package.accelerate_package()
    completed = subprocess.run(
        [sys.executable, modeling_cases.__file__, str(package)], capture_output=True, text=True, timeout=300
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    return json.loads(completed.stdout.splitlines()[-1])


@pytest.mark.compat
def test_every_case_gives_what_accelerate_gives(accelerate_results: dict[str, Any]) -> None:
    ours = modeling_cases.compute(drivetrain_modeling)
    assert set(ours) == set(accelerate_results)
    different = {
        name: (ours[name], accelerate_results[name])
        for name in ours
        if ours[name] != accelerate_results[name]
    }
    assert not different, "\n".join(
        f"{name}: drivetrain {a}, Accelerate {b}" for name, (a, b) in different.items()
    )


def test_retie_parameters_ties_each_group_again() -> None:
    model = modeling_cases._layers(5)
    retie_parameters(
        model, [["linear1.weight", "linear4.weight"], ["linear2.weight", "linear3.weight", "linear5.weight"]]
    )
    assert model.linear1.weight is model.linear4.weight
    assert model.linear2.weight is model.linear3.weight is model.linear5.weight
    assert drivetrain_modeling.find_tied_parameters(model) == [
        ["linear1.weight", "linear4.weight"],
        ["linear2.weight", "linear3.weight", "linear5.weight"],
    ]


def test_offload_state_dict_writes_a_folder_dispatch_reads(tmp_path: Path) -> None:
    model = modeling_cases.ModelForTest().eval()
    x = torch.randn(3, 3)
    expected = model.linear2(model.batchnorm(model.linear1(x)))
    offload_state_dict(tmp_path / "offload", model.state_dict())
    empty = modeling_cases.ModelForTest().eval().to("meta")
    empty.forward = lambda x: empty.linear2(empty.batchnorm(empty.linear1(x)))  # type: ignore[method-assign]
    from drivetrain.big_modeling import dispatch_model

    dispatch_model(empty, {"": "disk"}, offload_dir=tmp_path / "offload")
    with torch.no_grad():
        assert torch.equal(empty(x), expected)


def test_bad_sizes_are_explained() -> None:
    with pytest.raises(ValueError, match="'lots' is not a size"):
        convert_file_size_to_int("lots")
    with pytest.raises(ValueError, match=r"max_memory\[0\]='x' is not a size"):
        drivetrain_modeling.get_balanced_memory(nn.Linear(2, 2), max_memory={0: "x"})
