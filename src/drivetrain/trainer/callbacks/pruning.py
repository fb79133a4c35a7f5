"""``ModelPruning``: prune weights during the fit with :mod:`torch.nn.utils.prune` (Lightning's arguments).

At the end of each training epoch (or validation, with ``prune_on_train_epoch_end=False``) the
chosen parameters are pruned by ``amount`` (pruning accumulates: 0.5 twice leaves a quarter),
optionally the surviving weights go back to their values from before training (the lottery
ticket hypothesis), and when the fit ends the pruning is made permanent: the masks are applied
and the ``*_orig``/``*_mask`` reparametrisation is removed. Checkpoints hold the pruned weights
under the parameters' own names, so they load into an unpruned model.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from drivetrain._utilities.log import get_logger
from drivetrain.trainer.callbacks.callback import Callback
from drivetrain.trainer.state import TrainerFn

if TYPE_CHECKING:
    from drivetrain.trainer.module import TrainingModule
    from drivetrain.trainer.trainer import Trainer

_log = get_logger(__name__)

#: ``pruning_fn`` names → the :mod:`torch.nn.utils.prune` method classes.
_METHODS = {
    "ln_structured": "LnStructured",
    "l1_unstructured": "L1Unstructured",
    "random_structured": "RandomStructured",
    "random_unstructured": "RandomUnstructured",
}
_Amount = int | float


def _zeros(module: nn.Module, name: str) -> tuple[int, int]:
    """(zero entries, entries) of the effective parameter ``module.<name>``."""
    tensor = getattr(module, name)
    return int((tensor == 0).sum()), tensor.numel()


def _pruned_state_dict(module: nn.Module) -> dict[str, Any]:
    """``module.state_dict()`` with each pruned ``<name>_orig``/``<name>_mask`` pair replaced by ``<name>`` (masked)."""
    from torch.nn.utils import prune

    pruned = {
        f"{prefix}.{hook._tensor_name}" if prefix else hook._tensor_name
        for prefix, submodule in module.named_modules()
        for hook in submodule._forward_pre_hooks.values()
        if isinstance(hook, prune.BasePruningMethod)
    }
    state = module.state_dict()
    result: dict[str, Any] = {}
    for key, value in state.items():
        base = key.removesuffix("_orig")
        if key.endswith("_orig") and base in pruned:
            result[base] = (value * state[base + "_mask"]).detach()
        elif not (key.endswith("_mask") and key.removesuffix("_mask") in pruned):
            result[key] = value
    return result


class ModelPruning(Callback):
    """Prune the model's weights during training.

    Args:
        pruning_fn: ``"l1_unstructured"``, ``"random_unstructured"``, ``"ln_structured"``,
            ``"random_structured"``; a ``torch.nn.utils.prune.BasePruningMethod`` subclass; or a function
            ``fn(module, name, amount)`` used for each parameter (local pruning only).
        parameters_to_prune: ``(module, name)`` pairs (default: every ``parameter_names`` parameter of
            every submodule).
        parameter_names: the names to prune by default: ``["weight", "bias"]``.
        use_global_unstructured: prune the parameters together (the smallest ``amount`` of all of them),
            for unstructured methods only; ``False`` prunes ``amount`` of each.
        amount: the fraction (float in [0, 1]) or number (int) of entries to prune, or a function
            ``epoch -> amount``.
        apply_pruning: whether to prune, or a function ``epoch -> bool``.
        make_pruning_permanent: remove the reparametrisation when the fit ends.
        use_lottery_ticket_hypothesis: after pruning, reset the surviving weights to their values from
            before training (or a function ``epoch -> bool``).
        resample_parameters: with the lottery ticket, draw fresh initial values instead.
        pruning_dim: the dimension structured methods prune along.
        pruning_norm: the norm of ``ln_structured``.
        verbose: 0 quiet, 1 the overall sparsity, 2 also per parameter (through the drivetrain logger).
        prune_on_train_epoch_end: prune at the end of each training epoch (else of each validation).

    Example:
        >>> trainer = Trainer(callbacks=[ModelPruning("l1_unstructured", amount=0.5)])  # doctest: +SKIP
    """

    PARAMETER_NAMES = ("weight", "bias")

    def __init__(
        self,
        pruning_fn: Callable[..., Any] | str,
        parameters_to_prune: Sequence[tuple[nn.Module, str]] = (),
        parameter_names: list[str] | None = None,
        use_global_unstructured: bool = True,
        amount: _Amount | Callable[[int], _Amount] = 0.5,
        apply_pruning: bool | Callable[[int], bool] = True,
        make_pruning_permanent: bool = True,
        use_lottery_ticket_hypothesis: bool | Callable[[int], bool] = True,
        resample_parameters: bool = False,
        pruning_dim: int | None = None,
        pruning_norm: int | None = None,
        verbose: int = 0,
        prune_on_train_epoch_end: bool = True,
    ) -> None:
        from torch.nn.utils import prune

        self._use_global_unstructured = use_global_unstructured
        self._parameters_to_prune = list(parameters_to_prune)
        self._parameter_names = list(parameter_names or self.PARAMETER_NAMES)
        self._global_kwargs: dict[str, Any] = {}
        self._original_layers: dict[int, dict[str, Any]] | None = None
        self._pruning_method_name: str | None = None
        self._resample_parameters = resample_parameters
        self._prune_on_train_epoch_end = prune_on_train_epoch_end
        for name in self._parameter_names:
            if name not in self.PARAMETER_NAMES:
                raise ValueError(
                    f"ModelPruning(parameter_names=...): {name!r} is not one of {list(self.PARAMETER_NAMES)}."
                )
        if isinstance(pruning_fn, str):
            key = pruning_fn.lower()
            if key not in _METHODS:
                raise ValueError(
                    f"ModelPruning(pruning_fn={pruning_fn!r}) is not a known method; use one of {sorted(_METHODS)}, a "
                    f"torch.nn.utils.prune.BasePruningMethod subclass or a function fn(module, name, amount)."
                )
            method = getattr(prune, _METHODS[key])
            if key.endswith("_structured"):
                if pruning_dim is None:
                    raise ValueError(f"ModelPruning('{key}') prunes along a dimension: pass pruning_dim.")
                if key == "ln_structured" and pruning_norm is None:
                    raise ValueError("ModelPruning('ln_structured') needs pruning_norm (e.g. 1 or 2).")
            pruning_fn = self._method_function(method, key, dim=pruning_dim, n=pruning_norm)
        elif inspect.isclass(pruning_fn) and issubclass(pruning_fn, prune.BasePruningMethod):
            pruning_fn = self._method_function(pruning_fn, pruning_fn.__name__)
        elif not callable(pruning_fn):
            raise TypeError(
                f"ModelPruning(pruning_fn={pruning_fn!r}): use a method name, a pruning method class or a function."
            )
        elif use_global_unstructured:
            raise ValueError(
                "ModelPruning(use_global_unstructured=True) needs a pruning method (a name or a BasePruningMethod "
                "subclass), not a plain function; pass use_global_unstructured=False to call it per parameter."
            )
        method_type = getattr(self._global_kwargs.get("pruning_method"), "PRUNING_TYPE", "unstructured")
        if use_global_unstructured and method_type != "unstructured":
            raise ValueError(
                f"ModelPruning(use_global_unstructured=True) prunes entries across parameters, but "
                f"{self._pruning_method_name} is structured. Use an unstructured method, or "
                f"use_global_unstructured=False."
            )
        self.pruning_fn: Callable[..., Any] = pruning_fn
        self._apply_pruning = self._check_bool_or_callable("apply_pruning", apply_pruning)
        self._use_lottery_ticket_hypothesis = self._check_bool_or_callable(
            "use_lottery_ticket_hypothesis", use_lottery_ticket_hypothesis
        )
        self._make_pruning_permanent = bool(make_pruning_permanent)
        if not callable(amount):
            self._check_amount(amount)
        self.amount = amount
        if verbose not in (0, 1, 2):
            raise ValueError(f"ModelPruning(verbose={verbose!r}): use 0, 1 or 2.")
        self._verbose = verbose

    # -- argument checks --------------------------------------------------------------------------
    @staticmethod
    def _check_bool_or_callable(name: str, value: Any) -> Any:
        if not isinstance(value, bool) and not callable(value):
            raise TypeError(f"ModelPruning({name}={value!r}): use True, False or a function epoch -> bool.")
        return value

    @staticmethod
    def _check_amount(amount: Any) -> None:
        if isinstance(amount, bool) or not isinstance(amount, (int, float)):
            raise TypeError(
                f"ModelPruning amount={amount!r}: use a float in [0, 1], an int >= 0 or a function epoch -> amount."
            )
        if isinstance(amount, float) and not 0.0 <= amount <= 1.0:
            raise ValueError(f"ModelPruning amount={amount}: a fraction must be in [0, 1].")
        if isinstance(amount, int) and amount < 0:
            raise ValueError(f"ModelPruning amount={amount}: a number of entries must be >= 0.")

    def _method_function(self, method: Any, name: str, **kwargs: Any) -> Callable[..., Any]:
        kwargs = {k: v for k, v in kwargs.items() if v is not None}
        self._pruning_method_name = name
        if self._use_global_unstructured:
            self._global_kwargs = {"pruning_method": method, **kwargs}

        def apply(module: nn.Module, name: str, amount: _Amount) -> None:
            method.apply(module, name, amount=amount, **kwargs)

        return apply

    # -- what to prune ----------------------------------------------------------------------------
    def filter_parameters_to_prune(
        self, parameters_to_prune: Sequence[tuple[nn.Module, str]] = ()
    ) -> Sequence[tuple[nn.Module, str]]:
        """Override to narrow the ``(module, name)`` pairs to prune."""
        return parameters_to_prune

    @staticmethod
    def sanitize_parameters_to_prune(
        pl_module: nn.Module,
        parameters_to_prune: Sequence[tuple[nn.Module, str]] = (),
        parameter_names: Sequence[str] = (),
    ) -> list[tuple[nn.Module, str]]:
        """The ``(module, name)`` pairs to prune: those given, checked; else every ``parameter_names`` parameter."""
        names = list(parameter_names or ModelPruning.PARAMETER_NAMES)
        if not parameters_to_prune:
            return [
                (module, name)
                for module in pl_module.modules()
                for name in names
                if isinstance(getattr(module, name, None), nn.Parameter) or hasattr(module, name + "_orig")
            ]
        resolved = []
        owned = {id(m) for m in pl_module.modules()}
        for pair in parameters_to_prune:
            if not (isinstance(pair, (tuple, list)) and len(pair) == 2 and isinstance(pair[0], nn.Module)):
                raise TypeError(
                    f"ModelPruning(parameters_to_prune=...): {pair!r} is not a (module, name) pair."
                )
            module, name = pair
            if id(module) not in owned:
                raise ValueError(
                    f"ModelPruning: {type(module).__name__} in parameters_to_prune is not part of the model."
                )
            if getattr(module, name, None) is None:
                raise ValueError(f"ModelPruning: {type(module).__name__} has no parameter {name!r} to prune.")
            resolved.append((module, name))
        return resolved

    # -- hooks ------------------------------------------------------------------------------------
    def setup(self, trainer: Trainer, pl_module: TrainingModule, stage: str) -> None:
        if stage != "fit":
            return
        if trainer.strategy.requires_joint_setup:
            raise ValueError(
                f"ModelPruning reparametrises whole parameters, which the {type(trainer.strategy).__name__} shards "
                f"between the processes. Use it with one device or the 'ddp' strategies."
            )
        pairs = self.filter_parameters_to_prune(
            self.sanitize_parameters_to_prune(pl_module, self._parameters_to_prune, self._parameter_names)
        )
        self._parameters_to_prune = list(pairs)
        if not self._parameters_to_prune:
            raise ValueError(
                f"ModelPruning found nothing to prune in {type(pl_module).__name__} (parameter_names="
                f"{self._parameter_names}). Name the parameters with parameters_to_prune=[(module, 'weight'), ...]."
            )
        if self._use_lottery_ticket_hypothesis is not False:
            # The values to go back to: the parameters as they are before training (per module, by name).
            self._original_layers = {}
            for module, name in self._parameters_to_prune:
                entry = self._original_layers.setdefault(id(module), {"module": module, "data": {}})
                entry["data"][name] = self._effective(module, name).detach().clone()

    @staticmethod
    def _effective(module: nn.Module, name: str) -> torch.Tensor:
        original = getattr(module, name + "_orig", None)
        return original if original is not None else getattr(module, name)

    def on_train_epoch_end(self, trainer: Trainer, pl_module: TrainingModule) -> None:
        if self._prune_on_train_epoch_end:
            self._run_pruning(trainer.current_epoch)

    def on_validation_epoch_end(self, trainer: Trainer, pl_module: TrainingModule) -> None:
        fitting = trainer.state.fn == TrainerFn.FITTING and not trainer.sanity_checking
        if fitting and not self._prune_on_train_epoch_end:
            self._run_pruning(trainer.current_epoch)

    def on_train_end(self, trainer: Trainer, pl_module: TrainingModule) -> None:
        if self._make_pruning_permanent:
            self.make_pruning_permanent(pl_module)

    def on_save_checkpoint(
        self, trainer: Trainer, pl_module: TrainingModule, checkpoint: dict[str, Any]
    ) -> None:
        if not self._make_pruning_permanent or "state_dict" not in checkpoint:
            return
        if not any(hasattr(module, name + "_mask") for module, name in self._parameters_to_prune):
            return
        # The pruned weights under their own names (training goes on with the masks).
        checkpoint["state_dict"] = _pruned_state_dict(pl_module)

    # -- pruning ----------------------------------------------------------------------------------
    def _run_pruning(self, epoch: int) -> None:
        prune = self._apply_pruning(epoch) if callable(self._apply_pruning) else self._apply_pruning
        amount = self.amount(epoch) if callable(self.amount) else self.amount
        if not prune or not amount:
            return
        self._check_amount(amount)
        self.apply_pruning(amount)
        lottery = self._use_lottery_ticket_hypothesis
        if lottery(epoch) if callable(lottery) else lottery:
            self.apply_lottery_ticket_hypothesis()

    def apply_pruning(self, amount: _Amount) -> None:
        """Prune ``amount`` of the chosen parameters now (globally or per parameter)."""
        from torch.nn.utils import prune

        before = [_zeros(m, n) for m, n in self._parameters_to_prune] if self._verbose else []
        if self._use_global_unstructured:
            prune.global_unstructured(self._parameters_to_prune, amount=amount, **self._global_kwargs)
        else:
            for module, name in self._parameters_to_prune:
                self.pruning_fn(module, name=name, amount=amount)
        if self._verbose:
            self._log_sparsity(amount, before)

    @torch.no_grad()
    def apply_lottery_ticket_hypothesis(self) -> None:
        """Put the surviving weights back to their values from before training (the masks stay)."""
        assert self._original_layers is not None
        for entry in self._original_layers.values():
            module = entry["module"]
            for name, original in entry["data"].items():
                target = self._effective(module, name)
                value = torch.randn_like(original) * original.std() if self._resample_parameters else original
                target.copy_(value.to(target.device))

    @staticmethod
    def make_pruning_permanent(module: nn.Module) -> None:
        """Apply the masks to the weights and remove the ``*_orig``/``*_mask`` reparametrisation."""
        from torch.nn.utils import prune

        for submodule in module.modules():
            for hook in list(submodule._forward_pre_hooks.values()):
                if isinstance(hook, prune.BasePruningMethod):
                    prune.remove(submodule, hook._tensor_name)

    def _log_sparsity(self, amount: _Amount, before: list[tuple[int, int]]) -> None:
        after = [_zeros(m, n) for m, n in self._parameters_to_prune]
        total = sum(n for _, n in after)
        _log.info(
            f"[drivetrain] ModelPruning: {self._pruning_method_name or 'pruning'} with amount={amount}: "
            f"{sum(z for z, _ in before)} -> {sum(z for z, _ in after)} zeros of {total} "
            f"({100 * sum(z for z, _ in after) / max(total, 1):.2f}%)."
        )
        if self._verbose == 2:
            for (module, name), (was, _), (now, size) in zip(
                self._parameters_to_prune, before, after, strict=True
            ):
                _log.info(
                    f"[drivetrain] ModelPruning: {type(module).__name__}.{name}: {was} -> {now} zeros of {size} "
                    f"({100 * now / max(size, 1):.2f}%)."
                )
