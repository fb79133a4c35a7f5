"""Which linear layers of a model train in float8, why the others stay in bfloat16, and the swap itself.

A float8 matmul is faster than a bfloat16 one only when it is large enough to pay for the
scaling and casting around it (an absolute-maximum reduction and a cast of each input, in the
forward and in both backward matmuls). torchao's float8 README publishes the measured speed-up of
its float8 linear layer over bfloat16 for a grid of layer sizes on an H100, and its experimental
``_auto_filter_for_recipe`` applies the same cut-offs; :func:`too_small_to_gain` encodes them
(``N`` = ``out_features``, ``K`` = ``in_features``):

* tensorwise scaling: no gain when ``K <= 4096`` and ``N <= 1024``;
* rowwise scaling: no gain when ``N <= 2048``, or ``K <= 1024``, or ``N <= 4096`` and ``K <= 2048``.

So a 768-wide GPT keeps its attention output projection (768 x 768) and MLP down projection
(N = 768) in bfloat16 under tensorwise scaling, and every layer under rowwise scaling, while
every linear layer of a 4096-wide model trains in float8. These are measurements on one GPU
kind, not laws: ``Float8Precision(skip_small_layers=False)`` or a ``module_filter_fn`` of one's
own converts small layers too.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from torch import nn

#: float8 matmuls need both sizes of a linear layer's weight to be multiples of this.
DIMENSION_MULTIPLE = 16

#: Why a linear layer stays in bfloat16 (the values appear in the log line).
EDGE = "first or last linear layer"
NOT_DIVISIBLE = "a size not a multiple of 16"
TOO_SMALL = "too small to gain"
FILTERED = "left out by module_filter_fn"

#: The size guidance of each scaling granularity, as the log line states it.
GUIDANCE = {
    "tensorwise": "in_features <= 4096 and out_features <= 1024",
    "rowwise": "out_features <= 2048, in_features <= 1024, or out_features <= 4096 and in_features <= 2048",
}

ModuleFilter = Callable[[nn.Module, str], bool]


@dataclass
class LayerPlan:
    """The linear layers to swap for float8 ones, and each other linear layer with its reason."""

    float8: list[str] = field(default_factory=list)
    kept: dict[str, str] = field(default_factory=dict)

    def kept_for(self, reason: str) -> list[str]:
        return [name for name, why in self.kept.items() if why == reason]


def too_small_to_gain(out_features: int, in_features: int, granularity: str) -> bool:
    """Whether torchao's size guidance expects no speed-up for this layer (see the module docstring).

    Args:
        granularity: ``"tensorwise"`` or ``"rowwise"`` (what :func:`granularity_of` returns).
    """
    n, k = out_features, in_features
    if granularity == "tensorwise":
        return k <= 4096 and n <= 1024
    return n <= 2048 or k <= 1024 or (n <= 4096 and k <= 2048)


def granularity_of(config: Any) -> str:
    """``"tensorwise"`` or ``"rowwise"``: how a torchao ``Float8LinearConfig`` scales its inputs."""
    cast = getattr(config, "cast_config_input", None)
    granularity = getattr(getattr(cast, "scaling_granularity", None), "value", "tensorwise")
    return "tensorwise" if granularity == "tensorwise" else "rowwise"


def plan_layers(
    module: nn.Module,
    *,
    granularity: str = "tensorwise",
    module_filter_fn: ModuleFilter | None = None,
    skip_small: bool = True,
) -> LayerPlan:
    """Decide, for every ``nn.Linear`` below ``module``, whether it trains in float8.

    The rules, in order: a size not a multiple of 16 keeps a layer in bfloat16 (hardware);
    ``module_filter_fn(layer, fqn)`` decides where given; otherwise the first and last linear
    layers (registration order) stay, and, with ``skip_small``, layers too small to gain. Layers
    already converted, and ``module`` itself (a lone linear layer cannot be swapped in place), are
    not part of the plan.
    """
    import_torchao()
    from torchao.float8.float8_linear import Float8Linear

    linears = [
        (name, child) for name, child in module.named_modules() if isinstance(child, nn.Linear) and name
    ]
    edges = {linears[0][0], linears[-1][0]} if linears else set()
    plan = LayerPlan()
    for name, layer in linears:
        if isinstance(layer, Float8Linear):
            continue
        if not _divisible(layer):
            plan.kept[name] = NOT_DIVISIBLE
        elif module_filter_fn is not None:
            if module_filter_fn(layer, name):
                plan.float8.append(name)
            else:
                plan.kept[name] = FILTERED
        elif name in edges:
            plan.kept[name] = EDGE
        elif skip_small and too_small_to_gain(layer.out_features, layer.in_features, granularity):
            plan.kept[name] = TOO_SMALL
        else:
            plan.float8.append(name)
    return plan


def convert_linear_layers(
    module: nn.Module,
    *,
    config: Any = None,
    module_filter_fn: ModuleFilter | None = None,
    skip_small: bool = True,
) -> list[str]:
    """Swap ``module``'s chosen ``nn.Linear`` layers for torchao's ``Float8Linear``, in place.

    The choice is :func:`plan_layers`'s. Converting needs torchao but no float8 hardware;
    running the converted layers does.

    Returns:
        The fully qualified names of the converted layers, in order.

    Raises:
        ModuleNotFoundError: torchao is not installed.
    """
    granularity = granularity_of(config) if config is not None else "tensorwise"
    plan = plan_layers(
        module, granularity=granularity, module_filter_fn=module_filter_fn, skip_small=skip_small
    )
    swap(module, plan, config)
    return plan.float8


def swap(module: nn.Module, plan: LayerPlan, config: Any) -> None:
    """Replace the layers ``plan.float8`` names by ``Float8Linear`` (torchao's conversion, restricted to them)."""
    float8 = import_torchao()
    chosen = set(plan.float8)
    if chosen:
        float8.convert_to_float8_training(
            module, module_filter_fn=lambda _, fqn: fqn in chosen, config=config
        )


def float8_layer_names(module: nn.Module) -> list[str]:
    """The fully qualified names of ``module``'s float8 linear layers (empty without torchao)."""
    try:
        from torchao.float8.float8_linear import Float8Linear
    except ImportError:
        return []
    return [name for name, child in module.named_modules() if isinstance(child, Float8Linear)]


def import_torchao() -> Any:
    """``torchao.float8``, or a ``ModuleNotFoundError`` that names drivetrain's extra."""
    try:
        import torchao.float8 as float8
    except ImportError as error:
        raise ModuleNotFoundError(
            f"precision='fp8' trains with torchao's float8 layers, and torchao cannot be imported ({error}). "
            f"Install it with: pip install 'drivetrain[fp8]'"
        ) from None
    return float8


def _divisible(layer: nn.Module) -> bool:
    weight = getattr(layer, "weight", None)
    return weight is not None and all(size % DIMENSION_MULTIPLE == 0 for size in weight.shape)
