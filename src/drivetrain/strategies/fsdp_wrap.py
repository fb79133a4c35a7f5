"""How :class:`~drivetrain.strategies.FSDPStrategy` turns a user's module into an FSDP2 module.

The steps run in a fixed order, each a small function:

1. :func:`apply_activation_checkpointing` — recompute the chosen blocks' activations in backward;
2. :func:`shard_module` — ``fully_shard`` each block the wrap policy picks (bottom-up), then the root;
3. :func:`materialize_meta_module` — a model built on the meta device gets real storage for its
   shards only, and each block's ``reset_parameters()`` initialises it;
4. :func:`repoint_optimizers` — optimizers built on the original parameters are pointed at the
   sharded ones (FSDP2 replaces every parameter with a DTensor of the same name).
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any, Union

import torch
from torch import nn
from torch.optim import Optimizer

#: A wrap or checkpointing policy: module classes, a predicate, or (wrap only) a parameter count.
ModulePolicy = Union[
    set[type[nn.Module]], list[type[nn.Module]], tuple[type[nn.Module], ...], Callable[[nn.Module], bool]
]


def policy_predicate(
    policy: ModulePolicy | int | None, argument: str, allow_count: bool
) -> Callable[[nn.Module], bool] | int | None:
    """Check a policy argument and return it as a predicate (or a parameter count)."""
    if policy is None:
        return None
    if isinstance(policy, int) and not isinstance(policy, bool):
        if not allow_count:
            raise TypeError(
                f"{argument}= does not take a number ({policy}); pass module classes or a predicate."
            )
        if policy < 1:
            raise ValueError(f"{argument}={policy}: a minimum parameter count must be at least 1.")
        return policy
    if isinstance(policy, (set, frozenset, list, tuple)):
        classes = tuple(policy)
        bad = [c for c in classes if not (isinstance(c, type) and issubclass(c, nn.Module))]
        if bad or not classes:
            raise TypeError(
                f"{argument}= got {policy!r}; a collection must hold nn.Module subclasses, "
                f"e.g. {{nn.TransformerEncoderLayer}}."
            )
        return lambda module: isinstance(module, classes)
    if callable(policy) and not isinstance(policy, type):
        return policy
    expected = "module classes, a predicate module -> bool" + (
        ", or a minimum parameter count" if allow_count else ""
    )
    raise TypeError(f"{argument}= got {policy!r} of type {type(policy).__name__}; pass {expected}.")


def apply_activation_checkpointing(module: nn.Module, predicate: Callable[[nn.Module], bool] | None) -> int:
    """Make every submodule ``predicate`` picks recompute its forward in backward; returns how many.

    The module's ``forward`` is replaced on the instance, so parameter names (and checkpoints)
    are the same as without checkpointing.
    """
    if predicate is None:
        return 0
    chosen = [m for m in module.modules() if m is not module and predicate(m)]
    for block in chosen:
        block.forward = _checkpointed(block.forward)
    return len(chosen)


def _checkpointed(forward: Callable[..., Any]) -> Callable[..., Any]:
    from torch.utils.checkpoint import checkpoint

    @functools.wraps(forward)
    def run(*args: Any, **kwargs: Any) -> Any:
        return checkpoint(forward, *args, use_reentrant=False, **kwargs)

    return run


def shard_module(
    module: nn.Module,
    predicate: Callable[[nn.Module], bool] | int | None,
    fsdp_kwargs: dict[str, Any],
) -> int:
    """``fully_shard`` the blocks ``predicate`` picks, bottom-up, then ``module``; returns the block count.

    With a parameter count, a block is sharded on its own when it holds at least that many
    parameters not already in a sharded descendant.
    """
    from torch.distributed.fsdp import fully_shard

    claimed: set[int] = set()
    blocks = 0
    for block in _post_order(module):
        if block is module:
            continue
        if isinstance(predicate, int):
            own = [p for p in block.parameters() if id(p) not in claimed]
            chosen = sum(p.numel() for p in own) >= predicate
        else:
            chosen = predicate is not None and predicate(block)
        if chosen and any(id(p) not in claimed for p in block.parameters()):
            claimed.update(id(p) for p in block.parameters())
            fully_shard(block, **fsdp_kwargs)
            blocks += 1
    fully_shard(module, **fsdp_kwargs)
    return blocks


def _post_order(module: nn.Module) -> Iterable[nn.Module]:
    for child in module.children():
        yield from _post_order(child)
    yield module


def has_meta_tensors(module: nn.Module) -> bool:
    return any(t.is_meta for t in module.parameters()) or any(t.is_meta for t in module.buffers())


def materialize_meta_module(module: nn.Module, device: torch.device) -> None:
    """Allocate the (sharded) parameters of a module built on the meta device, then initialise them.

    Raises:
        TypeError: a module that owns parameters or buffers has no ``reset_parameters()`` to
            initialise them.
    """
    owners = [
        m
        for m in module.modules()
        if any(t.is_meta for t in m.parameters(recurse=False))
        or any(t.is_meta for t in m.buffers(recurse=False))
    ]
    lacking = sorted({type(m).__name__ for m in owners if not callable(getattr(m, "reset_parameters", None))})
    if lacking:
        raise TypeError(
            f"The model was built on the meta device (empty_init=True), but {', '.join(lacking)} own "
            f"parameters or buffers and define no reset_parameters() to initialise them after sharding. "
            f"Add reset_parameters() to those modules, or build the model without empty_init."
        )
    module.to_empty(device=device)
    with torch.no_grad(), _shard_local_random_init(module):
        for owner in owners:
            owner.reset_parameters()  # type: ignore[operator]


@contextmanager
def _shard_local_random_init(module: nn.Module) -> Iterator[None]:
    """On meshes without DTensor's RNG tracker (CPU), draw each rank's shards from its own stream.

    There, random ops on a DTensor run on the local shard with the default generator, so ranks
    seeded alike would fill every shard with the same numbers. Offsetting the seed by the rank
    (from a draw that keeps the caller's generator advancing as usual) makes the shards
    independent. CUDA meshes have the tracker, which reproduces a single-device init instead.
    """
    from torch.distributed.tensor import DTensor

    mesh = next((p.device_mesh for p in module.parameters() if isinstance(p, DTensor)), None)
    if mesh is None or mesh.device_type != "cpu":
        yield
        return
    import torch.distributed as dist

    seed = int(torch.randint(0, 2**62, (1,)).item())
    # The global rank: on a mesh of several dimensions (tensor parallel x FSDP) every rank holds
    # other shards, and the mesh has no single local rank.
    rank = dist.get_rank() if dist.is_initialized() else 0
    with torch.random.fork_rng(devices=[]), warnings.catch_warnings():
        # torch warns that random DTensor ops are "not completely supported" on CPU meshes:
        # this function is the handling of exactly that case.
        warnings.filterwarnings("ignore", message="DTensor random operators may not have complete support")
        torch.manual_seed(seed + rank)
        yield


def parameter_names(module: nn.Module) -> dict[int, str]:
    """``id(parameter) -> name`` for every parameter of ``module`` (taken before it is sharded)."""
    return {id(p): name for name, p in module.named_parameters()}


def repoint_optimizers(optimizers: list[Optimizer], names: dict[int, str], module: nn.Module) -> None:
    """Point each optimizer's parameter groups at ``module``'s current parameters, matched by name.

    Raises:
        ValueError: an optimizer already has state (it stepped before set-up), or holds a
            parameter that is not ``module``'s.
    """
    current = dict(module.named_parameters())
    for index, optimizer in enumerate(optimizers):
        if optimizer.state:
            raise ValueError(
                f"Optimizer {index} ({type(optimizer).__name__}) already has state: it stepped before the "
                f"strategy set it up. Set up the model and its optimizers before training."
            )
        for group in optimizer.param_groups:
            foreign = [p for p in group["params"] if id(p) not in names]
            if foreign:
                raise ValueError(
                    f"Optimizer {index} ({type(optimizer).__name__}) holds {len(foreign)} parameter(s) that do not "
                    f"belong to the module being set up (shape {tuple(foreign[0].shape)}, ...). Build it on "
                    f"model.parameters() of that module, and set up each model with its own optimizers."
                )
            group["params"] = [current[names[id(p)]] for p in group["params"]]
