"""Tensor-parallel plans: checked, then applied with torch's ``parallelize_module``.

A plan maps module paths (``fnmatch`` patterns per dotted part, as ``parallelize_module``
reads them: ``"blocks.*.mlp.up"``) to a ``ParallelStyle`` (``ColwiseParallel()``,
``RowwiseParallel()``, ``SequenceParallel()``, ``PrepareModuleInput(...)`` …) or to one of the
short names Hugging Face plans use: ``"colwise"``, ``"rowwise"``, ``"sequence_parallel"``.

Two mistakes that torch accepts silently are errors here: a plan entry that matches no module
(torch warns and skips it, leaving the layer replicated), and a split dimension the
tensor-parallel size does not divide (torch makes uneven shards, which later ``view``s of the
local output into heads get wrong). :func:`check_even_split` runs on every model after its
plan is applied, whichever front door applied it.
"""

from __future__ import annotations

from collections.abc import Mapping
from fnmatch import fnmatch
from typing import Any

from torch import nn

#: Short style names (as in Hugging Face ``tp_plan`` dicts) and the torch style each stands for.
STYLE_NAMES = ("colwise", "rowwise", "sequence_parallel")


def resolve_plan(plan: Any) -> dict[str, Any]:
    """``plan`` with every short style name replaced by its ``ParallelStyle``; checked for type.

    Raises:
        TypeError/ValueError: ``plan`` is not a dict of path -> style, or names an unknown style.
    """
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        ParallelStyle,
        RowwiseParallel,
        SequenceParallel,
    )

    if not isinstance(plan, Mapping) or not plan:
        raise TypeError(
            f"tp_plan= expects a non-empty dict of module path -> parallel style, e.g. "
            f"{{'mlp.up': ColwiseParallel(), 'mlp.down': RowwiseParallel()}}, got {plan!r}."
        )
    factories = {
        "colwise": ColwiseParallel,
        "rowwise": RowwiseParallel,
        "sequence_parallel": SequenceParallel,
    }
    resolved: dict[str, Any] = {}
    for path, style in plan.items():
        if not isinstance(path, str):
            raise TypeError(f"tp_plan keys are module paths (str), got {path!r}.")
        if isinstance(style, str):
            if style not in factories:
                raise ValueError(
                    f"tp_plan[{path!r}] = {style!r} is not a style name; use one of "
                    f"{', '.join(map(repr, STYLE_NAMES))} or a torch ParallelStyle instance."
                )
            style = factories[style]()
        elif not isinstance(style, ParallelStyle):
            raise TypeError(
                f"tp_plan[{path!r}] is {type(style).__name__}; use a torch.distributed.tensor.parallel "
                f"ParallelStyle (ColwiseParallel(), RowwiseParallel() …) or one of {', '.join(map(repr, STYLE_NAMES))}."
            )
        resolved[path] = style
    return resolved


def check_plan_matches(module: nn.Module, plan: Mapping[str, Any]) -> None:
    """Raise ``ValueError`` for a plan entry that names no submodule of ``module``."""
    names = [name for name, _ in module.named_modules()]
    for path in plan:
        if path == "":
            continue
        pattern = path.split(".")
        if not any(_matches(name.split("."), pattern) for name in names if name):
            sample = ", ".join(repr(n) for n in names[1:9]) or "none"
            raise ValueError(
                f"tp_plan entry {path!r} matches no submodule of {type(module).__name__}, so that layer would stay "
                f"unsplit. Module paths look like {sample}; '*' matches one part ('blocks.*.attn.q')."
            )


def _matches(parts: list[str], pattern: list[str]) -> bool:
    return len(parts) == len(pattern) and all(fnmatch(p, q) for p, q in zip(parts, pattern))


def apply_plan(module: nn.Module, mesh: Any, plan: Mapping[str, Any]) -> None:
    """Check ``plan`` against ``module`` and split its layers over the tensor-parallel ``mesh`` (in place)."""
    from torch.distributed.tensor.parallel import parallelize_module

    resolved = resolve_plan(plan)
    check_plan_matches(module, resolved)
    parallelize_module(module, mesh, resolved)


def check_even_split(module: nn.Module, tp_size: int) -> None:
    """Raise ``ValueError`` if a parameter is split over the tensor-parallel ranks unevenly.

    Only the tensor-parallel mesh dimension is checked: FSDP pads uneven shards itself.
    """
    from torch.distributed.tensor import DTensor, Shard

    if tp_size == 1:
        return
    for name, parameter in module.named_parameters():
        if not isinstance(parameter, DTensor):
            continue
        names = parameter.device_mesh.mesh_dim_names or ()
        if "tensor_parallel" not in names:
            continue
        placement = parameter.placements[names.index("tensor_parallel")]
        if isinstance(placement, Shard) and parameter.shape[placement.dim] % tp_size:
            size = parameter.shape[placement.dim]
            raise ValueError(
                f"{name} (shape {tuple(parameter.shape)}) is split along dimension {placement.dim} of size {size} "
                f"over tp={tp_size} ranks, which does not divide it. Use a tensor-parallel size that divides {size}, "
                f"or make that layer's size a multiple of {tp_size} (or leave the layer out of the plan)."
            )


def has_tensor_parallel_parameters(module: nn.Module) -> bool:
    """Whether any parameter of ``module`` is a DTensor on a mesh with a ``tensor_parallel`` dimension."""
    from torch.distributed.tensor import DTensor

    return any(
        isinstance(p, DTensor) and "tensor_parallel" in (p.device_mesh.mesh_dim_names or ())
        for p in module.parameters()
    )
