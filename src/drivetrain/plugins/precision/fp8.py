"""``"fp8"``: float8 matmuls in the model's linear layers (torchao), compiled, bfloat16 autocast elsewhere.

The linear layers chosen (see :mod:`drivetrain.plugins.precision.fp8_layers`) become torchao's
``Float8Linear`` (through ``torchao.float8.convert_to_float8_training``): their weights stay in
float32 and the optimizer sees the same parameters, but each forward and backward matmul casts
its inputs to float8 with a dynamic scale (per tensor for the ``"tensorwise"`` recipe, per row for
``"rowwise"``) and runs on the GPU's float8 tensor cores. Everything else runs under bfloat16
autocast, as with ``"bf16-mixed"``.

Which layers are converted by default: every ``nn.Linear`` except the model's first and last
ones (the embedding-side projection and the output head are the most sensitive to the float8
range), except those torchao's size guidance expects no gain from, and except those whose input or
output size is not a multiple of 16 (the float8 matmul needs it). A ``module_filter_fn(module,
fqn)`` replaces the first two rules; the third always holds. An info line names the layers kept
in bfloat16 and why.

What is converted is compiled (:mod:`drivetrain.plugins.precision.fp8_compile`): eager float8
was measured 3.5x *slower* than bfloat16. ``compile=False`` opts out, with a warning.

float8 tensor cores arrived with compute capability 8.9 (Ada: L4, L40; Hopper: H100, H200; and
later): other hardware is refused when the precision is built, with the fix in the message.
torchao is an optional dependency (``pip install 'drivetrain[fp8]'``) imported only here, when the
precision is built.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import torch
from torch import Tensor, nn

from drivetrain._utilities.apply import apply_to_collection
from drivetrain._utilities.log import get_logger
from drivetrain.plugins.precision import fp8_layers
from drivetrain.plugins.precision.fp8_compile import MODES, compile_float8
from drivetrain.plugins.precision.fp8_layers import (
    DIMENSION_MULTIPLE,
    convert_linear_layers,
    float8_layer_names,
    import_torchao,
)
from drivetrain.plugins.precision.precision import Precision

__all__ = [
    "DIMENSION_MULTIPLE",
    "EAGER_FLOAT8_COST",
    "MIN_CAPABILITY",
    "RECIPES",
    "Float8Precision",
    "check_float8_hardware",
    "convert_linear_layers",
    "float8_layer_names",
]

#: The float8 scaling recipes of ``torchao.float8.Float8LinearConfig.from_recipe_name``.
RECIPES = ("tensorwise", "rowwise", "rowwise_with_gw_hp")
#: The first CUDA compute capability with float8 tensor cores (Ada Lovelace).
MIN_CAPABILITY = (8, 9)
#: What running float8 layers eagerly was measured to cost (benchmarks/results/gpu-fp8.md).
EAGER_FLOAT8_COST = (
    "eager float8 was measured 3.5x slower than bfloat16 (H200, the 111 M-parameter benchmark GPT: 116,771 vs "
    "408,965 tokens/s, benchmarks/results/gpu-fp8.md): without torch.compile every float8 matmul runs its "
    "scaling and casting as separate kernels"
)

_log = get_logger(__name__)

ModuleFilter = Callable[[nn.Module, str], bool]


class Float8Precision(Precision):
    """float8 training of linear layers with torchao, compiled; bfloat16 autocast for the rest.

    Args:
        recipe: the scaling recipe, ``"tensorwise"`` (default; one scale per tensor, fastest),
            ``"rowwise"`` (one scale per row, more accurate) or ``"rowwise_with_gw_hp"`` (rowwise,
            weight gradients in high precision). Ignored when ``config`` is given.
        config: a ``torchao.float8.Float8LinearConfig`` to use as it is (Accelerate's
            ``AORecipeKwargs(config=...)``).
        module_filter_fn: ``(module, fully_qualified_name) -> bool``, which linear layers to
            convert (Accelerate's ``module_filter_func``). Default: all but the first and last,
            and but those too small to gain. Layers whose sizes are not multiples of 16 are never
            converted.
        skip_small_layers: keep the layers torchao's size guidance expects no speed-up from in
            bfloat16 (default ``True``; see :mod:`drivetrain.plugins.precision.fp8_layers`).
            Ignored with a ``module_filter_fn``, which decides alone.
        compile: what ``torch.compile`` covers: ``"model"`` (default; the smallest module holding
            every float8 layer, compiled in place), ``"layers"`` (each float8 layer on its own), or
            ``False`` (eager float8, much slower: a warning says by how much). Layers inside a
            module the user compiled are left to that compilation.
        compile_options: keyword arguments for ``nn.Module.compile`` (``mode``, ``backend`` …).
        device: the device type the model trains on; anything but a CUDA GPU with compute
            capability 8.9 or newer is an error.
        autocast_kwargs: further ``torch.autocast`` options (``enabled``, ``cache_enabled``).

    Raises:
        ValueError: hardware without float8 support, an unknown recipe or compile mode, or both
            ``recipe`` and ``config``.
        ModuleNotFoundError: torchao is not installed (``pip install 'drivetrain[fp8]'``).
        TypeError: a ``module_filter_fn`` that is not callable, or a ``config`` of another type.
    """

    name = "fp8"

    def __init__(
        self,
        recipe: str | None = None,
        *,
        config: Any = None,
        module_filter_fn: ModuleFilter | None = None,
        skip_small_layers: bool = True,
        compile: str | bool = "model",
        compile_options: dict[str, Any] | None = None,
        device: str | torch.device = "cuda",
        autocast_kwargs: dict[str, Any] | None = None,
    ) -> None:
        if recipe is not None and recipe not in RECIPES:
            raise ValueError(
                f"Float8Precision(recipe={recipe!r}) is not a torchao float8 recipe; use one of "
                f"{', '.join(map(repr, RECIPES))}."
            )
        if recipe is not None and config is not None:
            raise ValueError(
                "Float8Precision got both recipe= and config=; a config holds the recipe. Pass one "
                "(config=Float8LinearConfig.from_recipe_name(...) builds a config from a recipe name)."
            )
        if module_filter_fn is not None and not callable(module_filter_fn):
            raise TypeError(
                f"module_filter_fn must be a function (module, fqn) -> bool, got {type(module_filter_fn).__name__}."
            )
        mode = "model" if compile is True else compile
        if mode is not False and mode not in MODES:
            raise ValueError(
                f"Float8Precision(compile={compile!r}) is not a compile mode; use 'model' (the default: the module "
                f"holding the float8 layers), 'layers' (each float8 layer), or False (eager, much slower)."
            )
        if compile_options is not None and not isinstance(compile_options, dict):
            raise TypeError(
                f"Float8Precision(compile_options=...) expects a dict of nn.Module.compile arguments, got "
                f"{type(compile_options).__name__}."
            )
        self.device = _device_type(device)
        check_float8_hardware(self.device)
        float8 = import_torchao()
        #: The recipe name, or "custom" for a config given as it is.
        self.recipe = recipe or ("tensorwise" if config is None else "custom")
        if config is None:
            config = float8.Float8LinearConfig.from_recipe_name(recipe or "tensorwise")
        elif not isinstance(config, float8.Float8LinearConfig):
            raise TypeError(
                f"Float8Precision(config=...) expects a torchao.float8.Float8LinearConfig, got "
                f"{type(config).__name__}."
            )
        if mode is False:
            warnings.warn(
                f"Float8Precision(compile=False) runs the float8 layers eagerly: {EAGER_FLOAT8_COST}. Leave compile at "
                f"its default ('model'), compile the model yourself, or train in 'bf16-mixed'.",
                UserWarning,
                stacklevel=2,
            )
        self.config = config
        self.module_filter_fn = module_filter_fn
        self.skip_small_layers = bool(skip_small_layers)
        #: ``"model"``, ``"layers"`` or ``False``: see the class docstring.
        self.compile: str | bool = mode
        self.compile_options = dict(compile_options or {})
        self.autocast_kwargs = dict(autocast_kwargs or {})
        #: Fully qualified names of the linear layers converted by the latest :meth:`convert_module`.
        self.converted: list[str] = []
        #: Linear layers the latest :meth:`convert_module` kept in bfloat16 -> why.
        self.kept: dict[str, str] = {}
        #: Modules the latest :meth:`convert_module` compiled ("" or the class name: the whole module).
        self.compiled: list[str] = []
        self._ours: set[int] = set()

    @property
    def dtype(self) -> torch.dtype:
        """The dtype autocast computes in outside the float8 matmuls."""
        return torch.bfloat16

    def convert_module(self, module: nn.Module) -> nn.Module:
        """Swap the chosen linear layers of ``module`` for ``Float8Linear`` in place and compile them.

        See the module docstring; an info line says which layers train in float8, which stay in
        bfloat16 and why, and what was compiled.
        """
        granularity = fp8_layers.granularity_of(self.config)
        plan = fp8_layers.plan_layers(
            module,
            granularity=granularity,
            module_filter_fn=self.module_filter_fn,
            skip_small=self.skip_small_layers,
        )
        fp8_layers.swap(module, plan, self.config)
        self.converted = float8_layer_names(module)
        self.kept = plan.kept
        compiled = None
        if self.compile and self.converted:
            compiled = compile_float8(
                module, self.converted, str(self.compile), self.compile_options, self._ours
            )
            self.compiled = compiled.compiled or self.compiled
        if not self.converted:
            warnings.warn(
                f"precision='fp8' found no linear layer of {type(module).__name__} to train in float8, so it trains in "
                f"bfloat16 autocast only ({_kept_summary(plan.kept, granularity)}). Pass "
                f"Float8Precision(module_filter_fn=...) or skip_small_layers=False to choose layers, or use 'bf16-mixed'.",
                UserWarning,
                stacklevel=2,
            )
        elif plan.float8:
            covered = (
                f"; {len(compiled.covered_by_user)} run inside a module you compiled"
                if compiled and compiled.covered_by_user
                else ""
            )
            how = (
                f"compiled: {', '.join(repr(name) for name in compiled.compiled)}{covered}"
                if compiled and compiled.compiled
                else ("inside a module you compiled" if compiled else "eagerly (compile=False)")
            )
            kept = (
                f"; {len(self.kept)} stay in bfloat16: {_kept_summary(self.kept, granularity)}"
                if self.kept
                else ""
            )
            _log.info(
                f"precision='fp8': {len(self.converted)} linear layer(s) train in float8 ({self.recipe} scaling, {how}){kept}."
            )
        return module

    def forward_context(self, **autocast_options: Any) -> AbstractContextManager[Any]:
        """bfloat16 ``torch.autocast`` around the forward; the float8 layers cast for themselves."""
        options = {**self.autocast_kwargs, **autocast_options} if autocast_options else self.autocast_kwargs
        return torch.autocast(device_type=self.device, dtype=torch.bfloat16, **options)

    def convert_output(self, data: Any) -> Any:
        """bfloat16 tensors of an output back to float32, so losses are computed in full precision."""
        return apply_to_collection(data, Tensor, _to_float32)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(recipe={self.recipe!r}, compile={self.compile!r}, device={self.device!r})"
        )


def _kept_summary(kept: dict[str, str], granularity: str) -> str:
    """``"2 too small to gain (blocks.0.proj, blocks.1.proj) …"``: the kept layers by reason, a few names each."""
    if not kept:
        return "no linear layer qualifies"
    parts = []
    for reason in dict.fromkeys(kept.values()):
        names = [name for name, why in kept.items() if why == reason]
        shown = ", ".join(names[:4]) + (", …" if len(names) > 4 else "")
        text = f"{len(names)} {reason} ({shown})"
        if reason == fp8_layers.TOO_SMALL:
            text += (
                f" by torchao's size guidance for {granularity} scaling ({fp8_layers.GUIDANCE[granularity]}; "
                f"skip_small_layers=False converts them)"
            )
        parts.append(text)
    return "; ".join(parts)


def check_float8_hardware(device_type: str) -> None:
    """Raise unless ``device_type`` is a CUDA GPU with float8 tensor cores (compute capability 8.9+).

    Raises:
        ValueError: naming the requirement, what this machine has, and the alternatives.
    """
    fix = (
        "Train in 'bf16-mixed' here instead, or run on a GPU with float8 support: compute capability "
        f"{MIN_CAPABILITY[0]}.{MIN_CAPABILITY[1]} or newer (NVIDIA L4, L40, H100, H200, B200 ...)."
    )
    if device_type != "cuda":
        raise ValueError(
            f"precision='fp8' runs float8 matmuls on NVIDIA GPU tensor cores, but this run is on "
            f"{device_type!r} hardware, which has none. {fix}"
        )
    # Looked up through the module each time so a test can fake the hardware at torch's boundary.
    if not torch.cuda.is_available():
        raise ValueError(f"precision='fp8' needs a CUDA GPU, but none is available here. {fix}")
    capability = torch.cuda.get_device_capability()
    if tuple(capability) < MIN_CAPABILITY:
        raise ValueError(
            f"precision='fp8' needs float8 tensor cores, which this GPU ({torch.cuda.get_device_name()}, "
            f"compute capability {capability[0]}.{capability[1]}) lacks. {fix}"
        )


def _device_type(device: str | torch.device) -> str:
    if isinstance(device, torch.device):
        return device.type
    if not isinstance(device, str):
        raise TypeError(f"Float8Precision(device=...) expects a device type such as 'cuda', got {device!r}.")
    try:
        return torch.device(device).type
    except RuntimeError:
        raise ValueError(
            f"Float8Precision(device={device!r}) is not a device torch knows; pass 'cuda'."
        ) from None


def _to_float32(tensor: Tensor) -> Tensor:
    return tensor.to(torch.float32) if tensor.dtype == torch.bfloat16 else tensor
