"""``BaseFinetuning`` and ``BackboneFinetuning``: train with parts of the model frozen, unfreeze them later.

A subclass freezes layers in :meth:`BaseFinetuning.freeze_before_training` (called when the fit
is set up, before the optimizers are made) and unfreezes them in
:meth:`BaseFinetuning.finetune_function` (called at every epoch start), usually with
:meth:`BaseFinetuning.unfreeze_and_add_param_group`, which gives the optimizer a new parameter
group for them. The groups added are recorded by parameter name and kept in checkpoints: a
resumed fit re-creates them before the optimizer's state is loaded. Lightning's API.

With several processes (``ddp``), parameters frozen when the model was wrapped are not in DDP's
gradient averaging; once unfrozen, this callback averages their gradients before each optimizer
step, so the processes stay identical.
"""

from __future__ import annotations

from collections.abc import Generator, Iterable
from typing import TYPE_CHECKING, Any

from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm
from torch.optim import Optimizer

from drivetrain._utilities.log import get_logger
from drivetrain.trainer.callbacks.callback import Callback

if TYPE_CHECKING:
    from drivetrain.trainer.module import TrainingModule
    from drivetrain.trainer.trainer import Trainer

_log = get_logger(__name__)


def multiplicative(epoch: int) -> float:
    """``BackboneFinetuning``'s default ``lambda_func``: the backbone's rate doubles every epoch (Lightning 2.6's)."""
    return 2.0


class BaseFinetuning(Callback):
    """Freeze modules before training and unfreeze them at chosen epochs (subclass it).

    Override :meth:`freeze_before_training` and :meth:`finetune_function`.

    Example:
        >>> class UnfreezeAt(BaseFinetuning):
        ...     def freeze_before_training(self, pl_module):
        ...         self.freeze(pl_module.backbone)
        ...     def finetune_function(self, pl_module, current_epoch, optimizer):
        ...         if current_epoch == 3:
        ...             self.unfreeze_and_add_param_group(pl_module.backbone, optimizer, lr=1e-4)
    """

    def __init__(self) -> None:
        # Per optimizer: the parameter groups as names, once groups were added (kept in checkpoints).
        self._internal_optimizer_metadata: dict[int, list[dict[str, Any]]] = {}
        self._restarting = False
        self._trainer: Trainer | None = None
        self._frozen_at_wrap: set[int] = set()
        self._syncing: list[nn.Parameter] = []

    # -- what subclasses override -----------------------------------------------------------------
    def freeze_before_training(self, pl_module: TrainingModule) -> None:
        """Freeze what should not train at first (``self.freeze(pl_module.backbone)``)."""
        raise NotImplementedError(
            f"{type(self).__name__} must define freeze_before_training(self, pl_module)."
        )

    def finetune_function(self, pl_module: TrainingModule, epoch: int, optimizer: Optimizer) -> None:
        """Called at each epoch start for each optimizer: unfreeze here (``unfreeze_and_add_param_group``)."""
        raise NotImplementedError(
            f"{type(self).__name__} must define finetune_function(self, pl_module, epoch, optimizer)."
        )

    # -- tools ------------------------------------------------------------------------------------
    @staticmethod
    def flatten_modules(modules: nn.Module | Iterable[nn.Module | Iterable[Any]]) -> list[nn.Module]:
        """The leaf modules (and modules holding parameters directly) under ``modules``."""
        if isinstance(modules, nn.ModuleDict):
            modules = modules.values()
        if isinstance(modules, Iterable) and not isinstance(modules, nn.Module):
            collected: list[nn.Module] = []
            for item in modules:
                collected.extend(BaseFinetuning.flatten_modules(item))
            return collected
        if not isinstance(modules, nn.Module):
            raise TypeError(f"Expected a module or an iterable of modules, got {type(modules).__name__}.")
        return [m for m in modules.modules() if not list(m.children()) or m._parameters]

    @staticmethod
    def filter_params(
        modules: nn.Module | Iterable[Any], train_bn: bool = True, requires_grad: bool = True
    ) -> Generator[nn.Parameter, None, None]:
        """The parameters of ``modules`` whose ``requires_grad`` is ``requires_grad`` (BatchNorm's only with ``train_bn``)."""
        for module in BaseFinetuning.flatten_modules(modules):
            if isinstance(module, _BatchNorm) and not train_bn:
                continue
            for param in module.parameters(recurse=False):
                if param.requires_grad == requires_grad:
                    yield param

    @staticmethod
    def make_trainable(modules: nn.Module | Iterable[Any]) -> None:
        """Let ``modules`` train again (BatchNorm layers track their statistics again)."""
        for module in BaseFinetuning.flatten_modules(modules):
            if isinstance(module, _BatchNorm):
                module.track_running_stats = True
            for param in module.parameters(recurse=False):
                param.requires_grad = True

    @staticmethod
    def freeze_module(module: nn.Module) -> None:
        """Freeze one module's own parameters (a BatchNorm layer also stops tracking statistics)."""
        if isinstance(module, _BatchNorm):
            module.track_running_stats = False
        for param in module.parameters(recurse=False):
            param.requires_grad = False

    @staticmethod
    def freeze(modules: nn.Module | Iterable[Any], train_bn: bool = True) -> None:
        """Freeze ``modules``; with ``train_bn`` their BatchNorm layers stay trainable."""
        for module in BaseFinetuning.flatten_modules(modules):
            if isinstance(module, _BatchNorm) and train_bn:
                BaseFinetuning.make_trainable(module)
            else:
                BaseFinetuning.freeze_module(module)

    @staticmethod
    def filter_on_optimizer(optimizer: Optimizer, params: Iterable[nn.Parameter]) -> list[nn.Parameter]:
        """``params`` without those the optimizer already updates (a warning names how many)."""
        present = {id(p) for group in optimizer.param_groups for p in group["params"]}
        params = list(params)
        kept = [p for p in params if id(p) not in present]
        if len(kept) != len(params):
            _log.warning(
                f"[drivetrain] {len(params) - len(kept)} of the parameters to unfreeze are already in the optimizer; "
                f"they are not added again."
            )
        return kept

    @staticmethod
    def unfreeze_and_add_param_group(
        modules: nn.Module | Iterable[Any],
        optimizer: Optimizer,
        lr: float | None = None,
        initial_denom_lr: float = 10.0,
        train_bn: bool = True,
    ) -> None:
        """Unfreeze ``modules`` and add their parameters to ``optimizer`` as a new group.

        Args:
            lr: the group's learning rate (``None``: the first group's divided by ``initial_denom_lr``).
            initial_denom_lr: the divisor when ``lr`` is not given.
            train_bn: also train the BatchNorm layers.
        """
        if initial_denom_lr <= 0:
            raise ValueError(f"initial_denom_lr={initial_denom_lr!r}: use a positive number.")
        BaseFinetuning.make_trainable(modules)
        group_lr = optimizer.param_groups[0]["lr"] / initial_denom_lr if lr is None else float(lr)
        params = BaseFinetuning.filter_on_optimizer(
            optimizer, BaseFinetuning.filter_params(modules, train_bn, True)
        )
        if params:
            optimizer.add_param_group({"params": params, "lr": group_lr})

    # -- hooks ------------------------------------------------------------------------------------
    def setup(self, trainer: Trainer, pl_module: TrainingModule, stage: str) -> None:
        if stage != "fit":
            return
        if trainer.strategy.requires_joint_setup:
            raise ValueError(
                f"{type(self).__name__} adds parameter groups to the optimizer during the fit, which the "
                f"{type(trainer.strategy).__name__} (its optimizer is built with the sharded model) cannot take. Use "
                f"one device or the 'ddp' strategies."
            )
        self._trainer = trainer  # a resumed fit re-creates the groups as soon as their record is loaded
        self._syncing = []
        self.freeze_before_training(pl_module)
        self._frozen_at_wrap = {id(p) for p in pl_module.parameters() if not p.requires_grad}

    def on_fit_start(self, trainer: Trainer, pl_module: TrainingModule) -> None:
        if self._restarting:
            self._restore_param_groups(trainer, pl_module)

    def on_train_epoch_start(self, trainer: Trainer, pl_module: TrainingModule) -> None:
        for index, optimizer in enumerate(trainer.optimizers):
            groups = len(optimizer.param_groups)
            self.finetune_function(pl_module, trainer.current_epoch, optimizer)
            if len(optimizer.param_groups) != groups or index in self._internal_optimizer_metadata:
                self._internal_optimizer_metadata[index] = self._describe(pl_module, optimizer)
        self._watch_unwrapped(trainer, pl_module)

    def on_before_optimizer_step(
        self, trainer: Trainer, pl_module: TrainingModule, optimizer: Optimizer
    ) -> None:
        if not self._syncing:
            return
        strategy = trainer.strategy
        for param in self._syncing:
            if param.grad is not None:
                param.grad.copy_(strategy.all_reduce(param.grad, reduce_op="mean"))

    def teardown(self, trainer: Trainer, pl_module: TrainingModule, stage: str) -> None:
        self._trainer = None

    def state_dict(self) -> dict[str, Any]:
        return {"internal_optimizer_metadata": self._internal_optimizer_metadata}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        metadata = state_dict.get("internal_optimizer_metadata", {})
        self._internal_optimizer_metadata = {int(index): groups for index, groups in metadata.items()}
        self._restarting = True
        trainer = self._trainer
        if trainer is not None and trainer.optimizers and trainer.training_module is not None:
            # Now, before the optimizers' states (which include the added groups) are loaded.
            self._restore_param_groups(trainer, trainer.training_module)

    # -- helpers ----------------------------------------------------------------------------------
    @staticmethod
    def _describe(module: nn.Module, optimizer: Optimizer) -> list[dict[str, Any]]:
        names = {id(p): name for name, p in module.named_parameters()}
        return [
            {
                **{k: v for k, v in group.items() if k != "params"},
                "params": [names.get(id(p), "") for p in group["params"]],
            }
            for group in optimizer.param_groups
        ]

    def _restore_param_groups(self, trainer: Trainer, pl_module: TrainingModule) -> None:
        """Add the groups a previous run added (by parameter name) to optimizers that lack them."""
        self._restarting = False
        params = dict(pl_module.named_parameters())
        owners = {id(p): m for m in pl_module.modules() for p in m.parameters(recurse=False)}
        for index, groups in self._internal_optimizer_metadata.items():
            if index >= len(trainer.optimizers):
                continue
            optimizer = trainer.optimizers[index]
            for group in groups[len(optimizer.param_groups) :]:
                missing = [name for name in group["params"] if name not in params]
                if missing:
                    raise ValueError(
                        f"{type(self).__name__}: the checkpoint's optimizer {index} has a parameter group with "
                        f"{', '.join(missing[:3])}, which {type(pl_module).__name__} does not have. Resume with the "
                        f"same model."
                    )
                group_params = [params[name] for name in group["params"]]
                for param in group_params:
                    self.make_trainable(owners[id(param)])
                optimizer.add_param_group(
                    {**{k: v for k, v in group.items() if k != "params"}, "params": group_params}
                )
        self._watch_unwrapped(trainer, pl_module)

    def _watch_unwrapped(self, trainer: Trainer, pl_module: TrainingModule) -> None:
        """With several processes: the parameters unfrozen since the model was wrapped need their gradients averaged."""
        if trainer.world_size == 1 or not self._frozen_at_wrap:
            return
        self._syncing = [
            p for p in pl_module.parameters() if p.requires_grad and id(p) in self._frozen_at_wrap
        ]


class BackboneFinetuning(BaseFinetuning):
    """Train ``pl_module.backbone`` frozen until ``unfreeze_backbone_at_epoch``, then with a growing learning rate.

    At that epoch the backbone joins the optimizer as a new group with the rate ``backbone_initial_lr`` (or
    the first group's rate times ``backbone_initial_ratio_lr``); at each later epoch its rate is multiplied
    by ``lambda_func(epoch + 1)``, and with ``should_align`` never exceeds the first group's.

    Args:
        unfreeze_backbone_at_epoch: the epoch (0-based) the backbone unfreezes in.
        lambda_func: the factor for the backbone's rate each epoch after unfreezing (default 2.0).
        backbone_initial_ratio_lr: the backbone's first rate as a fraction of the first group's.
        backbone_initial_lr: the backbone's first rate (instead of the ratio).
        should_align: cap the backbone's rate at the first group's.
        initial_denom_lr: passed to :meth:`unfreeze_and_add_param_group`.
        train_bn: train the backbone's BatchNorm layers while it is frozen.
        verbose: log the rates when they change.
        rounding: decimals of the rates in those messages.

    Example:
        >>> trainer = Trainer(callbacks=[BackboneFinetuning(unfreeze_backbone_at_epoch=5)])  # doctest: +SKIP
    """

    def __init__(
        self,
        unfreeze_backbone_at_epoch: int = 10,
        lambda_func: Any = multiplicative,
        backbone_initial_ratio_lr: float = 1e-1,
        backbone_initial_lr: float | None = None,
        should_align: bool = True,
        initial_denom_lr: float = 10.0,
        train_bn: bool = True,
        verbose: bool = False,
        rounding: int = 12,
    ) -> None:
        super().__init__()
        if (
            isinstance(unfreeze_backbone_at_epoch, bool)
            or not isinstance(unfreeze_backbone_at_epoch, int)
            or (unfreeze_backbone_at_epoch < 0)
        ):
            raise ValueError(
                f"BackboneFinetuning(unfreeze_backbone_at_epoch={unfreeze_backbone_at_epoch!r}): use an int >= 0."
            )
        if not callable(lambda_func):
            raise TypeError(
                f"BackboneFinetuning(lambda_func={lambda_func!r}): pass a function epoch -> factor."
            )
        for name, value in (
            ("backbone_initial_ratio_lr", backbone_initial_ratio_lr),
            ("initial_denom_lr", initial_denom_lr),
        ):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise ValueError(f"BackboneFinetuning({name}={value!r}): use a positive number.")
        if backbone_initial_lr is not None and (
            isinstance(backbone_initial_lr, bool)
            or not isinstance(backbone_initial_lr, (int, float))
            or backbone_initial_lr <= 0
        ):
            raise ValueError(
                f"BackboneFinetuning(backbone_initial_lr={backbone_initial_lr!r}): use a positive number or None."
            )
        self.unfreeze_backbone_at_epoch = unfreeze_backbone_at_epoch
        self.lambda_func = lambda_func
        self.backbone_initial_ratio_lr = backbone_initial_ratio_lr
        self.backbone_initial_lr = backbone_initial_lr
        self.should_align = should_align
        self.initial_denom_lr = initial_denom_lr
        self.train_bn = train_bn
        self.verbose = verbose
        self.rounding = rounding
        self.previous_backbone_lr: float | None = None

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "previous_backbone_lr": self.previous_backbone_lr}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.previous_backbone_lr = state_dict.get("previous_backbone_lr")
        super().load_state_dict(state_dict)

    def setup(self, trainer: Trainer, pl_module: TrainingModule, stage: str) -> None:
        if stage == "fit" and not isinstance(getattr(pl_module, "backbone", None), nn.Module):
            raise ValueError(
                f"BackboneFinetuning freezes and unfreezes {type(pl_module).__name__}.backbone, which is not an "
                f"nn.Module attribute. Assign the part to fine-tune to self.backbone in __init__."
            )
        super().setup(trainer, pl_module, stage)

    def freeze_before_training(self, pl_module: TrainingModule) -> None:
        self.freeze(pl_module.backbone, train_bn=self.train_bn)

    def finetune_function(self, pl_module: TrainingModule, epoch: int, optimizer: Optimizer) -> None:
        current_lr = optimizer.param_groups[0]["lr"]
        if epoch == self.unfreeze_backbone_at_epoch:
            initial = (
                self.backbone_initial_lr
                if self.backbone_initial_lr is not None
                else current_lr * self.backbone_initial_ratio_lr
            )
            self.previous_backbone_lr = initial
            self.unfreeze_and_add_param_group(
                pl_module.backbone,
                optimizer,
                initial,
                train_bn=self.train_bn,
                initial_denom_lr=self.initial_denom_lr,
            )
            if self.verbose:
                _log.info(
                    f"[drivetrain] Epoch {epoch}: backbone unfrozen; lr {round(current_lr, self.rounding)}, backbone lr "
                    f"{round(initial, self.rounding)}."
                )
        elif epoch > self.unfreeze_backbone_at_epoch and self.previous_backbone_lr is not None:
            following = self.lambda_func(epoch + 1) * self.previous_backbone_lr
            if self.should_align and following > current_lr:
                following = current_lr
            optimizer.param_groups[-1]["lr"] = following
            self.previous_backbone_lr = following
            if self.verbose:
                _log.info(
                    f"[drivetrain] Epoch {epoch}: lr {round(current_lr, self.rounding)}, backbone lr "
                    f"{round(following, self.rounding)}."
                )
