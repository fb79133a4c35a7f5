"""Cases for Accelerate's modeling utilities, computed by a library given as a module (drivetrain's or Accelerate's).

    python modeling_cases.py SITE/accelerate     # prints Accelerate's results as JSON

run on drivetrain's interpreter with the pinned ``accelerate`` (the conformance environment,
``tests/compat/accelerate_package.py``) imported from its folder, in a process of its own;
``test_modeling_utils.py`` computes the same cases with ``drivetrain.utils`` and compares.
"""

from __future__ import annotations

import json
import sys
import warnings
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
from torch import nn


class ModelForTest(nn.Module):
    """236 bytes: linear1 64, batchnorm 72 (40 of them buffers), linear2 100."""

    def __init__(self) -> None:
        super().__init__()
        self.linear1 = nn.Linear(3, 4)
        self.batchnorm = nn.BatchNorm1d(4)
        self.linear2 = nn.Linear(4, 5)


def _layers(n: int, width: int = 10) -> nn.Sequential:
    return nn.Sequential(OrderedDict((f"linear{i}", nn.Linear(width, width)) for i in range(1, n + 1)))


def _tied_once() -> nn.Module:
    model = ModelForTest()
    model.linear1.weight = model.linear2.weight  # type: ignore[assignment]
    return model


def _tied_across_blocks(groups: int) -> nn.Module:
    model = nn.Sequential(OrderedDict((f"layer{i}", ModelForTest()) for i in (1, 2, 3)))
    model.layer3.linear2.weight = model.layer1.linear2.weight
    if groups > 1:
        model.layer2.linear2.weight = model.layer1.linear2.weight
    if groups > 2:
        model.layer2.linear1.weight = model.layer1.linear1.weight
    return model


def _tied_siblings() -> nn.Module:
    model = nn.Sequential(
        OrderedDict(
            [
                ("linear1", nn.Linear(4, 4)),
                ("linear2", nn.Linear(6, 6)),
                ("linear3", nn.Linear(4, 4)),
                ("linear4", nn.Linear(6, 6)),
            ]
        )
    )
    model.linear3.weight = model.linear1.weight
    model.linear3.bias = model.linear1.bias
    return model


def _with_buffers() -> nn.Module:
    model = ModelForTest()
    model.linear1.register_buffer("extra", torch.zeros(10, 2))
    model.batchnorm.register_buffer("extra", torch.zeros(10, 3))
    model.linear2.register_buffer("extra", torch.zeros(10, 3))
    model.linear2.register_buffer("mask", torch.zeros(3, dtype=torch.bool))
    return model


def _five_tied() -> nn.Module:
    model = _layers(5)
    model.linear1.weight = model.linear4.weight
    model.linear2.weight = model.linear3.weight
    model.linear5.weight = model.linear2.weight
    return model


def _device_map(result: Any) -> list[list[Any]]:
    """A map or budget as ``[key, value]`` pairs (JSON keeps ``0`` and ``"0"`` apart), in key order."""
    return sorted(([key, value] for key, value in result.items()), key=lambda pair: str(pair[0]))


def cases(lib: ModuleType) -> dict[str, Callable[[], Any]]:
    """Case name -> what computing it gives, with ``lib`` holding Accelerate's function names."""
    auto = lib.infer_auto_device_map
    maps: dict[str, Callable[[], Any]] = {
        "plain 200/200": lambda: auto(ModelForTest(), max_memory={0: 200, 1: 200}),
        "plain 200/172/200": lambda: auto(ModelForTest(), max_memory={0: 200, 1: 172, 2: 200}),
        "gpu 0 has nothing": lambda: auto(ModelForTest(), max_memory={0: 0, 1: 300}),
        "gpu 0 has nothing, cpu": lambda: auto(ModelForTest(), max_memory={0: 0, "cpu": 1000}),
        "three blocks": lambda: auto(
            nn.Sequential(ModelForTest(), ModelForTest(), ModelForTest()), max_memory={0: 500, 1: 500}
        ),
        "three blocks no split": lambda: auto(
            nn.Sequential(ModelForTest(), ModelForTest(), ModelForTest()),
            max_memory={0: 500, 1: 500},
            no_split_module_classes=["ModelForTest"],
        ),
        "tied once": lambda: auto(_tied_once(), max_memory={0: 200, 1: 200}),
        "tied across blocks": lambda: auto(_tied_across_blocks(1), max_memory={0: 400, 1: 500}),
        "three tied": lambda: auto(_tied_across_blocks(2), max_memory={0: 400, 1: 500}),
        "two tied groups": lambda: auto(_tied_across_blocks(3), max_memory={0: 400, 1: 500}),
        "tied siblings": lambda: auto(_tied_siblings(), max_memory={0: 250, 1: 400}),
        "buffers off the gpu": lambda: auto(_with_buffers(), max_memory={0: 400, "cpu": "1GB"}),
        "buffers offloaded": lambda: auto(
            _with_buffers(), max_memory={0: 400, "cpu": "1GB"}, offload_buffers=True
        ),
        "fallback": lambda: auto(_layers(4), max_memory={0: 600, "cpu": 10**6}, fallback_allocation=True),
        "no fallback": lambda: auto(_layers(4), max_memory={0: 600, "cpu": 10**6}),
        "half at float32": lambda: auto(
            ModelForTest().half(), max_memory={0: 150, 1: 150}, dtype=torch.float32
        ),
        "disk": lambda: auto(_layers(3), max_memory={"cpu": 500}),
    }
    found: dict[str, Callable[[], Any]] = {name: (lambda f=f: _device_map(f())) for name, f in maps.items()}
    for memory in (
        {0: 200, 1: 200},
        {0: 200, 2: 200},
        {0: 300, 1: 300},
        {0: 300, 1: 500},
        {0: 300, "cpu": 1000},
        {0: 0, 1: 300, 2: 300},
        {0: 0, "cpu": 100},
    ):
        found[f"balanced {memory}"] = lambda m=memory: _device_map(
            lib.get_balanced_memory(ModelForTest(), max_memory=dict(m))
        )
    found["balanced low_zero"] = lambda: _device_map(
        lib.get_balanced_memory(_layers(6, 20), max_memory={0: 3000, 1: 3000, 2: 3000}, low_zero=True)
    )
    found["balanced no split"] = lambda: _device_map(
        lib.get_balanced_memory(
            nn.Sequential(ModelForTest(), ModelForTest(), ModelForTest()),
            max_memory={0: 900, 1: 900},
            no_split_module_classes=["ModelForTest"],
        )
    )
    found["sizes"] = lambda: sorted(lib.compute_module_sizes(_with_buffers()).items())
    found["sizes at float16"] = lambda: sorted(
        lib.compute_module_sizes(_with_buffers(), dtype=torch.float16).items()
    )
    found["sizes of a half model at float32"] = lambda: sorted(
        lib.compute_module_sizes(ModelForTest().half(), dtype="float32").items()
    )
    found["sizes special"] = lambda: sorted(
        lib.compute_module_sizes(ModelForTest(), special_dtypes={"linear1.weight": torch.float16}).items()
    )
    found["buffer size"] = lambda: [
        lib.compute_module_total_buffer_size(_with_buffers()),
        lib.compute_module_total_buffer_size(_with_buffers().half()),
    ]
    found["dtype sizes"] = lambda: [
        lib.dtype_byte_size(d)
        for d in (
            torch.float32,
            torch.bool,
            torch.float16,
            torch.bfloat16,
            torch.int8,
            torch.float8_e4m3fn,
            torch.int64,
            torch.complex64,
        )
    ]
    found["file sizes"] = lambda: [
        lib.convert_file_size_to_int(s)
        for s in (12, "1GiB", "5MB", "5Mb", "2KB", "1.5GB", "3KiB", "7Kb", "2MiB")
    ]
    found["named tensors"] = lambda: [
        [n for n, _ in lib.named_module_tensors(module, **options)]
        for module, options in (
            (nn.BatchNorm1d(4), {}),
            (nn.BatchNorm1d(4), {"include_buffers": False}),
            (ModelForTest(), {}),
            (ModelForTest(), {"recurse": True}),
            (_with_buffers(), {"recurse": True, "include_buffers": False}),
        )
    ]
    found["tied parameters"] = lambda: [
        sorted(lib.find_tied_parameters(m))
        for m in (_layers(4), _tied_once(), _five_tied(), _tied_siblings())
    ]
    found["cleaned map"] = lambda: _device_map(
        lib.clean_device_map({"a.x": 0, "a.y": 0, "b.x.0": 1, "b.x.1": 1, "b.y.0": 2, "b.y.1": 2, "c": 2})
    )
    return found


def compute(lib: ModuleType) -> dict[str, Any]:
    """Every case as ``[result, number of warnings]``, or ``["error", exception type]``."""
    results: dict[str, Any] = {}
    for name, case in cases(lib).items():
        torch.manual_seed(0)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                results[name] = [case(), len([w for w in caught if issubclass(w.category, UserWarning)])]
            except Exception as error:  # a case that fails fails the same way in both, or differs
                results[name] = ["error", type(error).__name__]
    return json.loads(json.dumps(results))  # as the other process's JSON reads back


if __name__ == "__main__":
    sys.path.append(str(Path(sys.argv[1]).parent))
    import accelerate.utils.modeling as accelerate_modeling

    print(json.dumps(compute(accelerate_modeling)))
