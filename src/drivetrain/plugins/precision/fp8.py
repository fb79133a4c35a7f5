"""``"fp8"``: float8 matmuls in the model's linear layers (torchao), bfloat16 autocast elsewhere.

The linear layers chosen by a filter become torchao's ``Float8Linear`` (through
``torchao.float8.convert_to_float8_training``): their weights stay in float32 and the optimizer
sees the same parameters, but each forward and backward matmul casts its inputs to float8 with a
dynamic scale (per tensor for the ``"tensorwise"`` recipe, per row for ``"rowwise"``) and runs
on the GPU's float8 tensor cores. Everything else runs under bfloat16 autocast, as with
``"bf16-mixed"``.

Which layers are converted (the default filter, as Accelerate's torchao recipe does it): every
``nn.Linear`` except the model's first and last ones (the embedding-side projection and the
output head are the most sensitive to the float8 range) and except those whose input or output
size is not a multiple of 16 (the float8 matmul needs it). A ``module_filter_fn(module, fqn)``
replaces the first rule; the second always holds.

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
from drivetrain.plugins.precision.precision import Precision

#: The float8 scaling recipes of ``torchao.float8.Float8LinearConfig.from_recipe_name``.
RECIPES = ("tensorwise", "rowwise", "rowwise_with_gw_hp")
#: The first CUDA compute capability with float8 tensor cores (Ada Lovelace).
MIN_CAPABILITY = (8, 9)
#: float8 matmuls need both sizes of a linear layer's weight to be multiples of this.
DIMENSION_MULTIPLE = 16

_log = get_logger(__name__)

ModuleFilter = Callable[[nn.Module, str], bool]


class Float8Precision(Precision):
    """float8 training of linear layers with torchao, bfloat16 autocast for the rest.

    Args:
        recipe: the scaling recipe, ``"tensorwise"`` (default; one scale per tensor, fastest),
            ``"rowwise"`` (one scale per row, more accurate) or ``"rowwise_with_gw_hp"`` (rowwise,
            weight gradients in high precision). Ignored when ``config`` is given.
        config: a ``torchao.float8.Float8LinearConfig`` to use as it is (Accelerate's
            ``AORecipeKwargs(config=...)``).
        module_filter_fn: ``(module, fully_qualified_name) -> bool``, which linear layers to
            convert (Accelerate's ``module_filter_func``). Default: all but the first and last.
            Layers whose sizes are not multiples of 16 are never converted.
        device: the device type the model trains on; anything but a CUDA GPU with compute
            capability 8.9 or newer is an error.
        autocast_kwargs: further ``torch.autocast`` options (``enabled``, ``cache_enabled``).

    Raises:
        ValueError: hardware without float8 support, an unknown recipe, or both ``recipe`` and
            ``config``.
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
        self.device = _device_type(device)
        check_float8_hardware(self.device)
        float8 = _import_torchao()
        if config is None:
            config = float8.Float8LinearConfig.from_recipe_name(recipe or "tensorwise")
        elif not isinstance(config, float8.Float8LinearConfig):
            raise TypeError(
                f"Float8Precision(config=...) expects a torchao.float8.Float8LinearConfig, got "
                f"{type(config).__name__}."
            )
        #: The recipe name, or "custom" for a config given as it is.
        self.recipe = recipe or ("tensorwise" if config is None else "custom")
        self.config = config
        self.module_filter_fn = module_filter_fn
        self.autocast_kwargs = dict(autocast_kwargs or {})
        #: Fully qualified names of the linear layers converted by the latest :meth:`convert_module`.
        self.converted: list[str] = []

    @property
    def dtype(self) -> torch.dtype:
        """The dtype autocast computes in outside the float8 matmuls."""
        return torch.bfloat16

    def convert_module(self, module: nn.Module) -> nn.Module:
        """Swap the chosen linear layers of ``module`` for ``Float8Linear`` in place (see the module docstring)."""
        newly = convert_linear_layers(module, config=self.config, module_filter_fn=self.module_filter_fn)
        self.converted = float8_layer_names(module)
        if not self.converted:
            warnings.warn(
                f"precision='fp8' found no linear layer of {type(module).__name__} to train in float8 (the default filter "
                f"keeps the first and last linear layers, and sizes must be multiples of 16), so it trains in bfloat16 "
                f"autocast only. Pass Float8Precision(module_filter_fn=...) to choose layers, or use 'bf16-mixed'.",
                UserWarning,
                stacklevel=2,
            )
        elif newly:  # sharding strategies convert again before they shard: said once
            _log.info(
                f"precision='fp8': {len(self.converted)} linear layer(s) train in float8 ({self.recipe} scaling); "
                f"the others stay in bfloat16 autocast."
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
        return f"{type(self).__name__}(recipe={self.recipe!r}, device={self.device!r})"


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


def convert_linear_layers(
    module: nn.Module, *, config: Any = None, module_filter_fn: ModuleFilter | None = None
) -> list[str]:
    """Swap ``module``'s chosen ``nn.Linear`` layers for torchao's ``Float8Linear``, in place.

    The choice: ``module_filter_fn(layer, fqn)`` where given, else every linear layer but the
    first and the last (in registration order); in both cases only layers whose weight sizes are
    multiples of 16, and never ``module`` itself (a lone linear layer cannot be swapped in place)
    nor a layer already converted. Converting needs torchao but no float8 hardware; running the
    converted layers does.

    Returns:
        The fully qualified names of the converted layers, in order.

    Raises:
        ModuleNotFoundError: torchao is not installed.
    """
    float8 = _import_torchao()
    from torchao.float8.float8_linear import Float8Linear

    linears = [name for name, child in module.named_modules() if isinstance(child, nn.Linear) and name]
    edges = {linears[0], linears[-1]} if linears else set()
    converted: list[str] = []

    def choose(layer: nn.Module, fqn: str) -> bool:
        if not fqn or isinstance(layer, Float8Linear) or not _divisible(layer):
            return False
        wanted = module_filter_fn(layer, fqn) if module_filter_fn is not None else fqn not in edges
        if wanted:
            converted.append(fqn)
        return bool(wanted)

    float8.convert_to_float8_training(module, module_filter_fn=choose, config=config)
    return converted


def float8_layer_names(module: nn.Module) -> list[str]:
    """The fully qualified names of ``module``'s float8 linear layers (empty without torchao)."""
    try:
        from torchao.float8.float8_linear import Float8Linear
    except ImportError:
        return []
    return [name for name, child in module.named_modules() if isinstance(child, Float8Linear)]


def _divisible(layer: nn.Module) -> bool:
    weight = getattr(layer, "weight", None)
    return weight is not None and all(size % DIMENSION_MULTIPLE == 0 for size in weight.shape)


def _import_torchao() -> Any:
    try:
        import torchao.float8 as float8
    except ImportError as error:
        raise ModuleNotFoundError(
            f"precision='fp8' trains with torchao's float8 layers, and torchao cannot be imported ({error}). "
            f"Install it with: pip install 'drivetrain[fp8]'"
        ) from None
    return float8


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
