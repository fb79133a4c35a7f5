"""``Accelerator.prepare`` and friends: what each kind of object becomes for this run.

A base of :class:`drivetrain.Accelerator`. Modules are converted to the precision, placed and
wrapped by the strategy in the core's one order (:func:`drivetrain.strategies.model_setup.setup_model`,
which the Trainer follows too); optimizers and schedulers get the wrappers of
:mod:`drivetrain.facade.wrappers`; data loaders become
:class:`~drivetrain.data.PreparedDataLoader`. Every object is prepared at most once.
"""

from __future__ import annotations

import gc
import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from torch import nn
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LRScheduler, ReduceLROnPlateau
from torch.utils.data import DataLoader

from drivetrain._utilities.log import get_logger
from drivetrain.facade.process_control import ProcessControl
from drivetrain.facade.wrappers import PreparedOptimizer, PreparedScheduler
from drivetrain.strategies.model_setup import setup_model

if TYPE_CHECKING:
    from drivetrain.data.loader import PreparedDataLoader
    from drivetrain.utils.dynamo import TorchDynamoPlugin


class Preparation(ProcessControl):
    """``prepare``, ``prepare_model``, ``prepare_optimizer``, ``prepare_scheduler``, ``prepare_data_loader``,
    and their undoing, ``free_memory`` (a base of :class:`drivetrain.Accelerator`).

    Args:
        device_placement: move prepared models and batches to the device.
        rng_types: the generators prepared loaders share from rank 0 at each epoch start.
        step_scheduler_with_optimizer: step prepared schedulers with their optimizer.
        compiling: the settings ``prepare`` compiles models with (``None``: it compiles nothing).
        size_auto_strategy: the strategy came from ``"auto"``: the first model prepared for training is
            weighed against DDP.
        **base: :class:`ProcessControl`'s arguments.
    """

    def __init__(
        self,
        *,
        device_placement: bool,
        rng_types: tuple[str, ...],
        step_scheduler_with_optimizer: bool,
        compiling: TorchDynamoPlugin | None,
        size_auto_strategy: bool,
        **base: Any,
    ) -> None:
        super().__init__(**base)
        self.device_placement = device_placement
        self.rng_types = rng_types
        self.step_scheduler_with_optimizer = step_scheduler_with_optimizer
        self._compiling = compiling
        self._size_auto_strategy = size_auto_strategy

    def prepare(self, *args: Any, device_placement: Sequence[bool | None] | None = None) -> Any:
        """Prepare modules, optimizers, LR schedulers and data loaders, in any order.

        Returns them in the same order (one object alone is returned as it is). An object that
        was prepared before comes back as the same prepared object.
        """
        self._require_processes("prepare")
        placements: list[bool | None] = (
            list(device_placement) if device_placement is not None else [None] * len(args)
        )
        if len(placements) != len(args):
            raise ValueError(
                f"device_placement has {len(placements)} entries for {len(args)} objects; give one per object."
            )
        result = list(args)
        models = [i for i, obj in enumerate(args) if isinstance(obj, nn.Module)]
        optimizers = [i for i, obj in enumerate(args) if isinstance(obj, Optimizer)]
        if self.strategy.requires_joint_setup and models:
            self._prepare_jointly(result, models, optimizers, placements)
        else:
            for i in models:
                result[i] = self.prepare_model(args[i], device_placement=placements[i])
            _check_optimizers_train_a_model([args[i] for i in optimizers], self._objects.models)
            for i in optimizers:
                result[i] = self.prepare_optimizer(args[i], device_placement=placements[i])
        for i, obj in enumerate(args):
            if _is_scheduler(obj):
                result[i] = self.prepare_scheduler(obj)
            elif isinstance(obj, DataLoader):
                result[i] = self.prepare_data_loader(obj, device_placement=placements[i])
            elif obj is not None and not isinstance(obj, (nn.Module, Optimizer)):
                warnings.warn(
                    f"prepare() returns the {type(obj).__name__} it was given unchanged: it prepares modules, "
                    f"optimizers, LR schedulers and DataLoaders only.",
                    UserWarning,
                    stacklevel=2,
                )
        return result[0] if len(result) == 1 else tuple(result)

    def prepare_model(
        self, model: nn.Module, device_placement: bool | None = None, evaluation_mode: bool = False
    ) -> nn.Module:
        """Place ``model``, set up its precision and wrap it for the strategy (not with ``evaluation_mode``)."""
        self._require_processes("prepare_model")
        known = self._objects.known(model)
        if known is not None:
            return known
        if self.strategy.requires_joint_setup and not evaluation_mode:
            raise ValueError(
                f"{type(self.strategy).__name__} sets up a model together with its optimizers: pass them in one "
                f"call, accelerator.prepare(model, optimizer, ...)."
            )
        if self._size_auto_strategy and not evaluation_mode:
            self._report_auto_strategy(model)
        self._wrap_forward(model)
        wrapped, _ = setup_model(
            self.strategy,
            model,
            move_to_device=self.device_placement if device_placement is None else device_placement,
            wrap=not evaluation_mode,
        )
        return self._register_model(model, wrapped)

    def _report_auto_strategy(self, model: nn.Module) -> None:
        """With ``strategy="auto"``, say whether the first model trained fits DDP (the Trainer would switch).

        The Accelerator joins its processes' group when it is built, before any model is known
        (Accelerate's contract), so it keeps the DDP it built; a model that would not fit gets a
        warning with the figures and the fix instead.
        """
        from drivetrain.connector import auto_strategy_choice

        self._size_auto_strategy = False
        choice = auto_strategy_choice(self.strategy, model)
        if choice is None or choice.limit is None:
            return
        if choice.strategy == "ddp":
            get_logger(__name__).info(choice.reason)
            return
        warnings.warn(
            f"Accelerator(strategy='auto') runs DDP over {choice.num_processes} processes (chosen when it was built, "
            f"before the model was known), but {choice.why} Pass Accelerator(strategy='fsdp') to shard the model.",
            UserWarning,
            stacklevel=4,
        )

    def _wrap_forward(self, model: nn.Module) -> None:
        """Run ``model.forward`` in the precision's forward context (autocast), outputs in float32."""
        from drivetrain.plugins.precision.forward import PrecisionForward

        precision = self.strategy.precision
        if precision.changes_forward and not isinstance(model.__dict__.get("forward"), PrecisionForward):
            model.forward = PrecisionForward(model.forward, precision)

    def _register_model(self, original: nn.Module, wrapped: nn.Module) -> nn.Module:
        """Keep the strategy's module (what checkpoints, no-sync and clipping work on); returns the user's.

        With a dynamo backend the user gets ``torch.compile`` around the strategy's wrapper (as
        Accelerate does, so DDP's buckets split the graph); the Accelerator keeps working on the
        wrapper inside, which holds the model's own parameter names.
        """
        returned = wrapped
        if self._compiling is not None:
            from drivetrain.utils.dynamo import compile_module, is_compiled_module

            if not is_compiled_module(original):  # a model the user compiled is not compiled again
                returned = compile_module(wrapped, self._compiling)
        self._objects.models.append(wrapped)
        self._objects.remember(returned, original, wrapped, returned)
        if self._objects.backward_module is None:
            self._objects.backward_module = wrapped
        return returned

    def prepare_optimizer(
        self, optimizer: Optimizer, device_placement: bool | None = None
    ) -> PreparedOptimizer:
        """Wrap ``optimizer`` so it steps through the strategy and respects gradient accumulation."""
        self._require_processes("prepare_optimizer")
        known = self._objects.known(optimizer)
        if known is not None:
            return known
        if isinstance(optimizer, PreparedOptimizer):
            raise ValueError("This optimizer was prepared by another Accelerator; prepare the original one.")
        if self.strategy.requires_joint_setup:
            raise ValueError(
                f"{type(self.strategy).__name__} sets up optimizers together with their model: pass them in one "
                f"call, accelerator.prepare(model, optimizer, ...)."
            )
        raw = self.strategy.setup_optimizer(optimizer)
        if (self.device_placement if device_placement is None else device_placement) and raw.state:
            raw.load_state_dict(raw.state_dict())  # moves loaded state next to the (moved) parameters
        return self._register_optimizer(optimizer, raw, self._owner(raw))

    def _register_optimizer(
        self, original: Optimizer, raw: Optimizer, model: nn.Module | None
    ) -> PreparedOptimizer:
        prepared = PreparedOptimizer(raw, self.strategy, self.gradient_state, model)
        self._objects.optimizers.append(prepared)
        self._objects.remember(prepared, original, raw, prepared)
        return prepared

    def _owner(self, optimizer: Optimizer) -> nn.Module | None:
        ids = {id(p) for group in optimizer.param_groups for p in group["params"]}
        for model in self._objects.models:
            if ids & {id(p) for p in model.parameters()}:
                return model
        return None

    def _prepare_jointly(
        self, result: list[Any], models: list[int], optimizers: list[int], placements: list[bool | None]
    ) -> None:
        claimed: set[int] = set()
        for j in optimizers:
            known = self._objects.known(result[j])
            if known is not None:
                result[j] = known
                claimed.add(j)
        optimizers = [j for j in optimizers if j not in claimed]
        for i in models:
            model = result[i]
            known = self._objects.known(model)
            if known is not None:
                result[i] = known
                continue
            params = {id(p) for p in model.parameters()}
            mine = [
                j
                for j in optimizers
                if {id(p) for g in result[j].param_groups for p in g["params"]} <= params
            ]
            claimed.update(mine)
            self._wrap_forward(model)
            wrapped, raws = setup_model(
                self.strategy, model, [result[j] for j in mine], move_to_device=placements[i] is not False
            )
            returned = self._register_model(model, wrapped)
            if returned is not wrapped:  # compiled (FSDP shards the module in place: it is result[i])
                result[i] = returned
            for j, raw in zip(mine, raws):
                result[j] = self._register_optimizer(result[j], raw, wrapped)
        orphans = [result[j] for j in optimizers if j not in claimed]
        if orphans:
            raise ValueError(
                f"{type(self.strategy).__name__} sets up each optimizer with the model it optimizes, but "
                f"{len(orphans)} optimizer(s) match no model in this prepare() call. Pass each model with its "
                f"optimizers: accelerator.prepare(model, optimizer)."
            )

    def prepare_scheduler(self, scheduler: Any) -> PreparedScheduler:
        """Wrap ``scheduler`` so it steps only when its optimizer stepped."""
        from drivetrain.data.loader import data_parallel_share

        known = self._objects.known(scheduler)
        if known is not None:
            return known
        if isinstance(scheduler, PreparedScheduler):
            raise ValueError("This scheduler was prepared by another Accelerator; prepare the original one.")
        target = getattr(scheduler, "optimizer", None)
        followed = [opt for opt in self._objects.optimizers if target is opt or target is opt.optimizer]
        if not followed:
            original = self._objects.known(target)
            if isinstance(original, PreparedOptimizer):  # the strategy replaced it: follow the new one
                scheduler.optimizer = original.optimizer
                followed = [original]
        prepared = PreparedScheduler(
            scheduler,
            followed or list(self._objects.optimizers),
            self.gradient_state,
            # Data-parallel ranks: tensor-parallel peers share their batches.
            num_processes=1
            if self.dataloader_config.split_batches
            else data_parallel_share(self.strategy)[0],
            step_with_optimizer=self.step_scheduler_with_optimizer,
        )
        self._objects.schedulers.append(prepared)
        self._objects.remember(prepared, scheduler, prepared)
        return prepared

    def prepare_data_loader(
        self, data_loader: DataLoader, device_placement: bool | None = None, slice_fn_for_dispatch: Any = None
    ) -> PreparedDataLoader:
        """The loader this process iterates: sharded (or dispatched), one batch ahead, on the device."""
        from drivetrain.data.prepare import prepare_data_loader, uses_distributed_sampler

        self._require_processes("prepare_data_loader")
        if slice_fn_for_dispatch is not None:
            raise ValueError(
                "slice_fn_for_dispatch is not supported; dispatched batches are sliced along dim 0."
            )
        known = self._objects.known(data_loader)
        if known is not None:
            return known
        config = self.dataloader_config
        if self.strategy.world_size > 1 and uses_distributed_sampler(data_loader):
            warnings.warn(
                "The DataLoader already uses a DistributedSampler, so drivetrain keeps it and does not shard "
                "again; gather_for_metrics cannot drop the items it repeats to even out the ranks. Use a plain "
                "sampler (or shuffle=True) and let drivetrain shard the batches.",
                UserWarning,
                stacklevel=3,
            )
        prepared = prepare_data_loader(
            data_loader,
            self.strategy,
            split_batches=config.split_batches,
            even_batches=config.even_batches,
            dispatch_batches=config.dispatch_batches,
            rng_types=self.rng_types,
            device_placement=self.device_placement if device_placement is None else device_placement,
            data_seed=config.data_seed,
            use_seedable_sampler=config.use_seedable_sampler,
            active_loaders=self.gradient_state.loaders,
        )
        self._objects.dataloaders.append(prepared)
        self._objects.remember(prepared, data_loader, prepared)
        return prepared

    def skip_first_batches(self, dataloader: Any, num_batches: int = 0) -> Any:
        """A loader whose next epoch starts ``num_batches`` batches in (see :func:`drivetrain.data.skip_first_batches`)."""
        from drivetrain.data.prepare import skip_first_batches

        return skip_first_batches(dataloader, num_batches)

    def free_memory(self, *objects: Any) -> list[None]:
        """Forget every prepared object (and ``objects``), then collect garbage; returns ``None`` per object."""
        self._objects.clear()
        self.strategy.model = None
        self.gradient_state.step = 0
        gc.collect()
        return [None] * len(objects)

    clear = free_memory


def _is_scheduler(obj: Any) -> bool:
    return isinstance(obj, (LRScheduler, ReduceLROnPlateau, PreparedScheduler))


def _check_optimizers_train_a_model(optimizers: list[Any], models: list[nn.Module]) -> None:
    """Refuse an optimizer none of whose parameters belongs to a prepared model: training would change nothing.

    At prepare() (a set of ids), never per step.
    """
    if not optimizers or not models:
        return
    own = {id(parameter) for model in models for parameter in model.parameters()}
    for optimizer in optimizers:
        held = [p for group in getattr(optimizer, "param_groups", ()) for p in group["params"]]
        if held and not any(id(p) in own for p in held):
            names = ", ".join(type(model).__name__ for model in models)
            raise ValueError(
                f"prepare() got {type(optimizer).__name__} over {len(held)} parameter(s), none of which belongs to a "
                f"prepared model ({names}): training would not change their weights. Build the optimizer over the "
                f"model's parameters (torch.optim.SGD(model.parameters(), lr=...)), and prepare the model with it "
                f"(or before it)."
            )
