"""``torch.compile`` for what ``precision="fp8"`` converts: float8 only pays once its casts are fused.

Eagerly, each float8 linear layer runs its scaling and casting as separate kernels around every
``torch._scaled_mm`` (an absolute-maximum reduction, a division, a cast and a copy for each of
the two inputs, three times per step). On an H200 that made the 111 M-parameter benchmark GPT
train at 116,771 tokens/s in float8 against 408,965 in bfloat16: 3.5x slower
(``benchmarks/results/gpu-fp8.md``). torchao's speed-ups are measured with ``torch.compile``,
which fuses those kernels (and, compiling the whole model, fuses the casts into the layers
before and after).

Two ways, chosen by ``Float8Precision(compile=...)``:

``"model"`` (default)
    The smallest module holding every float8 layer (the model, in practice: ``self.net`` of a
    ``TrainingModule``, or the module given to ``Accelerator.prepare``) is compiled in place with
    ``nn.Module.compile`` (same object, same parameters and state-dict keys). Should a float8
    layer nevertheless run outside compiled code (a ``training_step`` that calls layers
    directly instead of the module's ``forward``), it compiles itself at that first eager call.
``"layers"``
    Each float8 layer is compiled on its own: fewer fusions, always honoured. Dynamo keeps one
    compiled graph per layer shape for all of them, up to ``torch._dynamo.config.recompile_limit``
    (8 by default) shapes; beyond that a warning says so, since the layers of further shapes would
    run eagerly.

Which is faster is measured by the GPU check (``benchmarks/README.md``). Layers a compiled module
of the user's already covers (``module.compile()``, or ``torch.compile(module)`` assigned as a
submodule) are left to it: compiling them again would change nothing (an inner ``torch.compile``
inside compiled code is ignored).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from drivetrain._utilities.log import get_logger

#: The values of ``Float8Precision(compile=...)`` besides ``False``.
MODES = ("model", "layers")

_log = get_logger(__name__)


@dataclass
class CompilePlan:
    """What :func:`compile_float8` did: the modules it compiled, and the layers others had compiled."""

    compiled: list[str] = field(default_factory=list)
    covered_by_user: list[str] = field(default_factory=list)


def is_compiled(module: nn.Module) -> bool:
    """Whether calling ``module`` runs compiled code (``module.compile()`` or ``torch.compile(module)``)."""
    if getattr(module, "_compiled_call_impl", None) is not None:
        return True
    return hasattr(module, "_orig_mod") and callable(getattr(module, "dynamo_ctx", None))


def compile_float8(
    module: nn.Module,
    float8_names: list[str],
    mode: str,
    options: Mapping[str, Any],
    ours: set[int],
) -> CompilePlan:
    """Compile, in place, what runs ``module``'s float8 layers ``float8_names`` (see the module docstring).

    Args:
        mode: ``"model"`` or ``"layers"``.
        options: keyword arguments of ``nn.Module.compile`` (``backend``, ``mode`` …).
        ours: ids of modules this precision compiled before (a second conversion, as sharding
            strategies do, compiles nothing again); updated.
    """
    plan = CompilePlan()
    uncovered = []
    for name in float8_names:
        cover = _compiled_ancestor(module, name)
        if cover is None:
            uncovered.append(name)
        elif id(module.get_submodule(cover)) not in ours:
            plan.covered_by_user.append(name)
    if not uncovered:
        return plan
    if mode == "layers":
        _warn_beyond_the_recompile_limit(module, uncovered)
    targets = uncovered if mode == "layers" else [_callable_ancestor(module, _common_prefix(uncovered))]
    for target in targets:
        submodule = module.get_submodule(target)
        submodule.compile(**options)
        ours.add(id(submodule))
        plan.compiled.append(target or type(module).__name__)
    if mode == "model":
        said: list[str] = []
        for name in uncovered:
            _compile_if_run_eagerly(module.get_submodule(name), name, options, ours, said)
    return plan


def _warn_beyond_the_recompile_limit(module: nn.Module, names: list[str]) -> None:
    import torch._dynamo

    config = torch._dynamo.config
    # Older torch calls the limit cache_size_limit.
    limit = getattr(config, "recompile_limit", getattr(config, "cache_size_limit", 8))
    shapes = {(layer.in_features, layer.out_features) for layer in map(module.get_submodule, names)}
    if len(shapes) > limit:
        warnings.warn(
            f"Float8Precision(compile='layers'): the float8 layers have {len(shapes)} different shapes, and torch.compile "
            f"keeps compiled code for at most {limit} (torch._dynamo.config.recompile_limit): layers of the other "
            f"shapes would run eagerly, at the cost of eager float8. Use compile='model', or raise the limit.",
            UserWarning,
            stacklevel=4,
        )


def _compiled_ancestor(root: nn.Module, name: str) -> str | None:
    """The outermost compiled module on the path from ``root`` to ``name`` (itself included), or None."""
    parts = name.split(".")
    for depth in range(len(parts) + 1):
        prefix = ".".join(parts[:depth])
        if is_compiled(root.get_submodule(prefix)):
            return prefix
    return None


def _common_prefix(names: list[str]) -> str:
    split = [name.split(".") for name in names]
    common: list[str] = []
    for parts in zip(*split):
        if len(set(parts)) != 1:
            break
        common.append(parts[0])
    return ".".join(common)


def _callable_ancestor(root: nn.Module, name: str) -> str:
    """``name`` or the nearest module above it that has a ``forward`` (a ``ModuleList`` has none)."""
    parts = name.split(".") if name else []
    while parts and not _has_forward(root.get_submodule(".".join(parts))):
        parts.pop()
    return ".".join(parts)


def _has_forward(module: nn.Module) -> bool:
    return type(module).forward is not nn.Module.forward and not isinstance(
        module, (nn.ModuleList, nn.ModuleDict)
    )


def _compile_if_run_eagerly(
    layer: nn.Module, name: str, options: Mapping[str, Any], ours: set[int], said: list[str]
) -> None:
    """A forward pre-hook that compiles ``layer`` the first time it runs outside compiled code.

    Inside compiled code the hook is traced away (``torch.compiler.is_compiling()`` is a
    constant there), so the compiled model pays nothing for it; eagerly it runs once and removes
    itself. ``said`` is shared by the layers of one model, so the info line comes once.
    """
    handles: list[Any] = []

    def compile_when_eager(module: nn.Module, args: Any) -> None:
        if torch.compiler.is_compiling():
            return
        handles[0].remove()
        if is_compiled(module):
            return
        module.compile(**options)
        ours.add(id(module))
        if not said:
            said.append(name)
            _log.info(
                f"precision='fp8': the float8 layer {name!r} ran outside the compiled model (the step calls it, not "
                f"the model's forward), so each such layer compiles on its own; Float8Precision(compile='layers') "
                f"does that from the start."
            )

    handles.append(layer.register_forward_pre_hook(compile_when_eager))
