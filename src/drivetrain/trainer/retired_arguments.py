"""Trainer arguments Lightning 2.0 removed (``gpus=``, ``tpu_cores=`` …): refused with the modern call.

Lightning 1.x chose hardware with one argument per kind (``Trainer(gpus=4)``); 2.0 replaced them
with ``accelerator=`` and ``devices=``. drivetrain refuses the old ones rather than accepting two
spellings of one setting: the error writes the call to make instead, with the value given.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from drivetrain._utilities.retired import Explanation

_REMOVED = "Lightning 1.x's way to choose hardware, removed in Lightning 2.0"


def _modern(owner: str, accelerator: str | None, devices: Any, rest: Mapping[str, Any]) -> str:
    arguments = [f"accelerator={accelerator!r}"] if accelerator is not None else []
    if devices is not None:
        arguments.append(f"devices={devices!r}")
    others = [
        f"{name}={_modern_value(name, value)!r}" for name, value in rest.items() if name not in _ARGUMENTS
    ]
    return f"{owner}({', '.join(arguments + others)})"


def _modern_value(name: str, value: Any) -> Any:
    # Lightning 1.x programs pair gpus= with precision=16, whose modern name is '16-mixed'.
    return "16-mixed" if name == "precision" and value in (16, "16") else value


def _gpus(owner: str, kwargs: Mapping[str, Any]) -> str:
    value = kwargs["gpus"]
    if value in (0, None, "0", []):
        call = _modern(owner, "cpu", None, kwargs)
        meaning = "gpus=0 meant no GPU"
    else:
        call = _modern(owner, "gpu", value, kwargs)
        meaning = "gpus= chose the GPUs (a count, -1 for all, or indices)"
    return f"{owner}(gpus={value!r}) is {_REMOVED} ({meaning}). Write {call}."


def _tpu_cores(owner: str, kwargs: Mapping[str, Any]) -> str:
    value = kwargs["tpu_cores"]
    return (
        f"{owner}(tpu_cores={value!r}) is {_REMOVED} (tpu_cores= chose the TPU cores). "
        f"Write {_modern(owner, 'tpu', value, kwargs)}."
    )


def _hpus(owner: str, kwargs: Mapping[str, Any]) -> str:
    value = kwargs["hpus"]
    return (
        f"{owner}(hpus={value!r}) is {_REMOVED} (hpus= chose the Gaudi cards). "
        f"Write {_modern(owner, 'hpu', value, kwargs)}."
    )


def _ipus(owner: str, kwargs: Mapping[str, Any]) -> str:
    return (
        f"{owner}(ipus={kwargs['ipus']!r}) is {_REMOVED}, and Graphcore IPUs have no maintained PyTorch backend "
        f"(PopTorch is no longer developed), so there is nothing to run on. Train on another accelerator: "
        f"{_modern(owner, 'auto', None, kwargs)}."
    )


def _num_processes(owner: str, kwargs: Mapping[str, Any]) -> str:
    value = kwargs["num_processes"]
    return (
        f"{owner}(num_processes={value!r}) is {_REMOVED} (num_processes= started CPU processes). "
        f"Write {_modern(owner, 'cpu', value, kwargs)}."
    )


_ARGUMENTS: dict[str, Explanation] = {
    "gpus": _gpus,
    "tpu_cores": _tpu_cores,
    "hpus": _hpus,
    "ipus": _ipus,
    "num_processes": _num_processes,
}
RETIRED_TRAINER_ARGUMENTS: Mapping[str, Explanation] = _ARGUMENTS
"""Lightning 1.x's hardware arguments and the message each gets."""
