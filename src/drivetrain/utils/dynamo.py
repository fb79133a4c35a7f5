"""``torch.compile`` in Accelerate's terms: ``DynamoBackend``, ``TorchDynamoPlugin``, ``is_compiled_module``.

``drivetrain.Accelerator(dynamo_backend="inductor")`` (or ``dynamo_plugin=TorchDynamoPlugin(...)``,
or ``ACCELERATE_DYNAMO_BACKEND`` / ``drivetrain launch --dynamo_backend``) makes ``prepare`` return
each model compiled: ``torch.compile`` around the strategy's wrapper (``DistributedDataParallel``
included, so torch splits the graph at its gradient buckets). Checkpoints, ``get_state_dict`` and
``save_model`` hold the model's own parameter names, never the compiled wrapper's ``_orig_mod.``.

Nothing here imports ``torch._dynamo``: that happens only when a backend is asked for.
"""

from __future__ import annotations

import dataclasses
import sys
import types
from enum import Enum
from typing import Any

import torch
from torch import nn

from drivetrain.utils.kwargs_handlers import KwargsHandler

#: ``mode`` values ``torch.compile`` takes (inductor's; other backends receive and may ignore them).
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


class DynamoBackend(str, Enum):
    """The ``torch.compile`` backends Accelerate names (``NO``: do not compile).

    Every member of Accelerate's enum is here so programs that name one run unchanged; a member
    whose backend this torch build does not have (``TENSORRT`` without torch-tensorrt …) is
    reported when the Accelerator is built. Any other backend registered with torch
    (``torch._dynamo.list_backends``) may be passed by its name.
    """

    NO = "NO"
    EAGER = "EAGER"
    AOT_EAGER = "AOT_EAGER"
    INDUCTOR = "INDUCTOR"
    AOT_TS_NVFUSER = "AOT_TS_NVFUSER"
    NVPRIMS_NVFUSER = "NVPRIMS_NVFUSER"
    CUDAGRAPHS = "CUDAGRAPHS"
    OFI = "OFI"
    FX2TRT = "FX2TRT"
    ONNXRT = "ONNXRT"
    TENSORRT = "TENSORRT"
    AOT_TORCHXLA_TRACE_ONCE = "AOT_TORCHXLA_TRACE_ONCE"
    TORCHXLA_TRACE_ONCE = "TORCHXLA_TRACE_ONCE"
    IPEX = "IPEX"
    TVM = "TVM"
    HPU_BACKEND = "HPU_BACKEND"


@dataclasses.dataclass
class TorchDynamoPlugin(KwargsHandler):
    """How ``Accelerator.prepare`` compiles models (``torch.compile``'s arguments).

    A field left at ``None`` takes Accelerate's environment variable when the Accelerator is
    built (``ACCELERATE_DYNAMO_BACKEND``, ``ACCELERATE_DYNAMO_MODE``,
    ``ACCELERATE_DYNAMO_USE_FULLGRAPH``, ``ACCELERATE_DYNAMO_USE_DYNAMIC``, which
    ``drivetrain launch --dynamo_backend …`` sets), else torch's default. The Accelerator keeps
    the resolved copy as ``accelerator.state.dynamo_plugin``.

    Args:
        backend: a :class:`DynamoBackend` or its name in any case (``"inductor"``, ``"eager"`` …),
            or the name of any backend registered with torch; ``"no"`` does not compile.
        mode: ``"default"``, ``"reduce-overhead"``, ``"max-autotune"`` or
            ``"max-autotune-no-cudagraphs"``.
        fullgraph: error out at a graph break instead of splitting the model into several graphs.
        dynamic: ``True`` traces with dynamic shapes, ``False`` specialises on every shape,
            ``None`` lets torch decide (it turns dynamic after a shape changes).
        options: backend options (a dict; inductor's ``torch._inductor.list_options()``); not
            together with a ``mode`` other than ``"default"``.
        disable: turn compilation off (``prepare`` returns the models uncompiled), for testing.
        use_regional_compilation: Accelerate's compile-each-repeated-block mode; not supported
            (``True`` is an error: compile the blocks yourself with ``torch.compile(block)``).

    Raises:
        TypeError, ValueError: a field with a value ``torch.compile`` cannot take.
    """

    backend: DynamoBackend | str | None = None
    mode: str | None = None
    fullgraph: bool | None = None
    dynamic: bool | None = None
    options: dict[str, Any] | None = None
    disable: bool = False
    use_regional_compilation: bool | None = None

    def __post_init__(self) -> None:
        if self.backend is not None:
            self.backend = backend_of(self.backend, "TorchDynamoPlugin(backend=...)")
        if self.mode is not None and self.mode not in COMPILE_MODES:
            raise ValueError(
                f"TorchDynamoPlugin(mode={self.mode!r}) is not a torch.compile mode; use one of "
                f"{', '.join(map(repr, COMPILE_MODES))}."
            )
        for name in ("fullgraph", "dynamic", "use_regional_compilation"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, bool):
                raise TypeError(f"TorchDynamoPlugin({name}=...) takes True, False or None, got {value!r}.")
        if not isinstance(self.disable, bool):
            raise TypeError(f"TorchDynamoPlugin(disable=...) takes True or False, got {self.disable!r}.")
        if self.options is not None and not isinstance(self.options, dict):
            raise TypeError(
                f"TorchDynamoPlugin(options=...) takes a dict of backend options, got {type(self.options).__name__}."
            )
        if self.options and self.mode not in (None, "default"):
            raise ValueError(
                f"TorchDynamoPlugin(mode={self.mode!r}, options=...): torch.compile takes a mode or options, not "
                f"both. Drop the mode, or put its settings into options."
            )
        if self.use_regional_compilation:
            raise ValueError(
                "TorchDynamoPlugin(use_regional_compilation=True) is not supported by drivetrain: it compiles the "
                "whole model. To compile repeated blocks one by one, compile the model yourself with "
                "drivetrain.utils.compile_regions(model) before prepare and leave dynamo_backend unset."
            )

    @property
    def compiles(self) -> bool:
        """Whether ``prepare`` compiles models with these settings."""
        return self.backend not in (None, DynamoBackend.NO) and not self.disable

    def to_kwargs(self) -> dict[str, Any]:
        """``torch.compile``'s keyword arguments for the settings that differ from torch's defaults.

        As Accelerate's: unset values (``None``), ``fullgraph=False``, ``mode="default"`` and the
        ``"no"`` backend are left out, so ``torch.compile(model, **plugin.to_kwargs())`` passes only
        what was asked for.
        """
        kwargs: dict[str, Any] = {}
        backend = self.backend
        if backend is not None and backend != DynamoBackend.NO:
            kwargs["backend"] = backend.value.lower() if isinstance(backend, DynamoBackend) else backend
        if self.mode not in (None, "default"):
            kwargs["mode"] = self.mode
        if self.fullgraph:
            kwargs["fullgraph"] = True
        if self.dynamic is not None:
            kwargs["dynamic"] = self.dynamic
        if self.options:
            kwargs["options"] = dict(self.options)
        return kwargs


def backend_of(value: Any, where: str) -> DynamoBackend | str:
    """``value`` as a :class:`DynamoBackend` member when it names one (in any case), else the torch name.

    Raises:
        TypeError: not a string.
        ValueError: an empty name.
    """
    if isinstance(value, DynamoBackend):
        return value
    if not isinstance(value, str):
        raise TypeError(
            f"{where} takes a DynamoBackend or a backend name such as 'inductor', got {type(value).__name__}."
        )
    name = value.strip()
    if not name:
        raise ValueError(f"{where}: the backend name is empty; use 'no', 'eager', 'aot_eager', 'inductor' ….")
    member = DynamoBackend.__members__.get(name.upper())
    return member if member is not None else name


def check_backend_available(plugin: TorchDynamoPlugin) -> None:
    """Fail early (when the Accelerator is built) if torch has no backend of that name.

    Raises:
        ValueError: the backend is not registered with this torch build, with the ones that are.
    """
    import torch._dynamo

    name = plugin.to_kwargs()["backend"]
    available = torch._dynamo.list_backends(exclude_tags=())
    if name not in available:
        raise ValueError(
            f"dynamo backend {name!r} is not available in this torch build (its package may be missing). "
            f"Available: {', '.join(sorted(available))}; or use dynamo_backend='no' to train uncompiled."
        )


def compile_module(module: nn.Module, plugin: TorchDynamoPlugin) -> nn.Module:
    """``torch.compile(module)`` with ``plugin``'s settings (a fresh copy of its options each time:
    torch takes entries out of the dict it is given)."""
    import torch

    compiled = torch.compile(module, **plugin.to_kwargs())
    assert isinstance(compiled, nn.Module)  # torch.compile of a module returns its OptimizedModule
    return compiled


def compiled_inner(module: Any) -> nn.Module | None:
    """The module inside ``torch.compile``'s wrapper if ``module`` is one, else ``None``."""
    if not is_compiled_module(module):
        return None
    inner: nn.Module = module._orig_mod
    return inner


def uncompiled(module: Any) -> Any:
    """``module`` without ``torch.compile``'s wrapper (itself if it has none)."""
    inner = compiled_inner(module)
    return module if inner is None else inner


def is_compiled_module(module: Any) -> bool:
    """Whether ``module`` is the wrapper ``torch.compile`` returns for a module (``OptimizedModule``)."""
    eval_frame = sys.modules.get("torch._dynamo.eval_frame")
    if eval_frame is None:  # nothing was ever compiled in this process
        return False
    return isinstance(module, eval_frame.OptimizedModule)


def is_repeated_blocks(module: nn.Module) -> bool:
    """Whether ``module`` is a non-empty ``ModuleList`` of modules of one class (a stack of blocks)."""
    return (
        isinstance(module, nn.ModuleList)
        and len(module) > 0
        and all(type(m) is type(module[0]) for m in module)
    )


def has_repeated_blocks(module: nn.Module) -> bool:
    """Whether a stack of blocks (:func:`is_repeated_blocks`) is somewhere under ``module``."""
    return any(is_repeated_blocks(sub) for sub in module.modules())


def has_compiled_regions(module: nn.Module) -> bool:
    """Whether some module under ``module`` is a ``torch.compile`` wrapper."""
    return any(is_compiled_module(sub) for sub in module.modules())


def compile_regions(module: nn.Module, **compile_kwargs: Any) -> nn.Module:
    """``module`` with each block of its stacks of blocks compiled on its own, and the rest compiled too.

    Blocks of one class compile once and the others reuse the compiled code, so a deep model
    starts much faster than under one ``torch.compile`` of the whole (Accelerate's regional
    compilation). The result is a new module sharing the parameters; the original stays at
    ``result._orig_mod`` (``unwrap_model`` and ``extract_model_from_parallel`` give it back).

    Args:
        module: the model.
        **compile_kwargs: ``torch.compile``'s arguments (``backend``, ``mode``, ``dynamic`` …).
    """
    if not isinstance(module, nn.Module):
        raise TypeError(f"compile_regions expects a torch.nn.Module, got {type(module).__name__}.")
    compiled = _compile_regions(module, compile_kwargs)
    if "_orig_mod" not in compiled.__dict__:
        compiled.__dict__["_orig_mod"] = module  # a plain attribute: not a submodule of the copy
    return compiled


def _compile_regions(module: nn.Module, compile_kwargs: dict[str, Any]) -> nn.Module:
    if isinstance(module, nn.ModuleList) and is_repeated_blocks(module):
        return nn.ModuleList([torch.compile(block, **compile_kwargs) for block in module])  # type: ignore[misc]
    if not has_repeated_blocks(module):
        return torch.compile(module, **compile_kwargs)  # type: ignore[return-value]
    # A shallow copy whose children are compiled region by region; the original is left as it is.
    copy = type(module).__new__(type(module))
    copy.__dict__.update(module.__dict__)
    for name, value in list(copy.__dict__.items()):
        if isinstance(value, types.MethodType) and value.__self__ is module:
            copy.__dict__[name] = types.MethodType(value.__func__, copy)  # methods bound to the original
    copy._modules = {name: _compile_regions(child, compile_kwargs) for name, child in module.named_children()}
    return copy
