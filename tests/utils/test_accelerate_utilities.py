"""Accelerate's utilities of the third fidelity pass: version checks, regional compilation, and the configuration
dataclasses' fields and defaults (compared with the pinned Accelerate's)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

import drivetrain as dt
import drivetrain.utils as dtu
from drivetrain.utils import (
    AORecipeKwargs,
    compare_versions,
    compile_regions,
    extract_model_from_parallel,
    has_compiled_regions,
    is_compiled_module,
    is_torch_version,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "compat"))
sys.path.insert(0, str(Path(__file__).parent))

import accelerate_package
import dataclass_fields

#: Accelerate's configuration dataclasses and kwargs handlers that drivetrain provides.
CLASSES = [
    "AORecipeKwargs",
    "AutocastKwargs",
    "DataLoaderConfiguration",
    "DistributedDataParallelKwargs",
    "GradScalerKwargs",
    "GradientAccumulationPlugin",
    "InitProcessGroupKwargs",
    "ParallelismConfig",
    "ProfileKwargs",
    "ProjectConfiguration",
    "TorchContextParallelConfig",
    "TorchDynamoPlugin",
    "TorchTensorParallelConfig",
]


@pytest.mark.compat
def test_the_dataclasses_have_accelerates_fields_and_defaults() -> None:
    package = accelerate_package.accelerate_package()
    completed = subprocess.run(
        [sys.executable, dataclass_fields.__file__, str(package), *CLASSES],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    theirs = json.loads(completed.stdout.splitlines()[-1])
    ours = {name: dataclass_fields.fields(getattr(dtu, name, None) or getattr(dt, name)) for name in CLASSES}
    assert ours == theirs


def test_version_checks() -> None:
    assert is_torch_version(">=", "2.0") and not is_torch_version("<", "2.0")
    assert compare_versions("1.10.0", ">", "1.9") and compare_versions("numpy", ">=", "1.0")
    with pytest.raises(ValueError, match="operation='=>' is not a comparison"):
        is_torch_version("=>", "2.0")


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.linear(x)) + x


class Stack(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(3, 4)
        self.blocks = nn.ModuleList(Block() for _ in range(3))
        self.head = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def test_compile_regions_compiles_each_block_and_keeps_the_original() -> None:
    model = Stack()
    x = torch.randn(2, 3)
    compiled = compile_regions(model, backend="eager")
    assert compiled is not model and compiled._orig_mod is model
    assert all(is_compiled_module(block) for block in compiled.blocks)
    assert is_compiled_module(compiled.embed) and is_compiled_module(compiled.head)
    assert not has_compiled_regions(model) and has_compiled_regions(compiled)
    assert compiled.blocks[0]._orig_mod is model.blocks[0]  # the same parameters
    with torch.no_grad():  # (dynamo reads .grad of the blocks' non-leaf inputs, which warns under autograd)
        assert torch.allclose(compiled(x), model(x))
    assert extract_model_from_parallel(compiled, keep_torch_compile=False) is model
    assert is_compiled_module(compile_regions(nn.Linear(2, 2), backend="eager"))  # no blocks: the whole


def test_ao_recipe_kwargs_build_the_config_from_their_flags() -> None:
    pytest.importorskip("torchao")
    config = AORecipeKwargs(pad_inner_dim=True).to_kwargs()["config"]
    assert (config.pad_inner_dim, config.enable_fsdp_float8_all_gather) == (True, False)
    with pytest.raises(ValueError, match="with your own config, set them in it"):
        AORecipeKwargs(config=config, enable_fsdp_float8_all_gather=True)
