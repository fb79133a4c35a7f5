"""``drivetrain.Accelerator``: the Accelerate-style training-loop API on the drivetrain core.

A script written for ``accelerate.Accelerator`` runs after changing its import. Every setting
resolves through :func:`drivetrain.connect` into one Strategy, and everything the Accelerator
does with hardware, processes and precision goes through that strategy. Each Accelerator keeps
its own state (no process-wide singleton).

Launch: under ``drivetrain launch`` / ``torchrun`` / SLURM the Accelerator joins the processes
the launcher started. In a plain ``python train.py`` with ``devices=N`` it starts the other
``N - 1`` processes itself by re-running the script (this process continues as rank 0); with
``strategy="ddp_spawn"``/``"ddp_fork"`` run the training function with :meth:`launch`.

Structure: the Accelerator owns a registry of what it prepared (:mod:`drivetrain.facade.prepared`)
and hands it to its parts: the process questions and collectives (:mod:`~drivetrain.facade.process_control`)
and ``prepare`` (:mod:`~drivetrain.facade.preparation`) are its bases; saving and loading the state
(:mod:`~drivetrain.facade.checkpointing`), saving models (:mod:`~drivetrain.facade.model_saving`) and
the trackers (:mod:`~drivetrain.facade.tracking`) are services it delegates to. This module is long
because it is the documented public surface of Accelerate's API; the work is in those modules.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import TYPE_CHECKING, Any

from torch import Tensor, nn
from torch.optim import Optimizer

from drivetrain._utilities.retired import refuse_retired_arguments
from drivetrain.facade import settings, tracking
from drivetrain.facade.checkpointing import StateCheckpoints
from drivetrain.facade.model_saving import ModelSaver
from drivetrain.facade.preparation import Preparation
from drivetrain.facade.prepared import PreparedObjects
from drivetrain.facade.process_state import AcceleratorState, PartialState
from drivetrain.facade.retired_arguments import RETIRED_ACCELERATOR_ARGUMENTS
from drivetrain.facade.tracking import Trackers
from drivetrain.facade.wrappers import PreparedOptimizer
from drivetrain.strategies.launchers.overrides import accelerate_variables
from drivetrain.strategies.step_policy import (
    check_accumulation_steps,
    check_clip_value,
    clip_gradients,
    unscale_and_clip,
)
from drivetrain.utils import current

# The core, the data layer and the loggers are imported where an Accelerator is built or used, so
# that ``from drivetrain import Accelerator`` costs little more than ``import torch``.
if TYPE_CHECKING:
    from drivetrain.accelerators.accelerator import Accelerator as HardwareAccelerator
    from drivetrain.connector import PluginInput
    from drivetrain.plugins.precision.precision import Precision
    from drivetrain.strategies.layout import ParallelismConfig
    from drivetrain.strategies.strategy import Strategy
    from drivetrain.utils.configuration import (
        DataLoaderConfiguration,
        DistributedType,
        GradientAccumulationPlugin,
        ProjectConfiguration,
    )
    from drivetrain.utils.dynamo import DynamoBackend, TorchDynamoPlugin
    from drivetrain.utils.kwargs_handlers import AutocastKwargs, ProfileKwargs


class Accelerator(Preparation):
    """Prepare models, optimizers, schedulers and data loaders for any hardware and number of processes.

    Accelerate's arguments come first, then drivetrain's (``accelerator`` … ``plugins``, as for
    :func:`drivetrain.connect`).

    Args:
        device_placement: put prepared models and batches on the device.
        split_batches: cut each batch into one slice per process (the batch size is global).
        mixed_precision: ``"no"``, ``"fp16"`` or ``"bf16"`` (``fp16=True`` means ``"fp16"``); by
            default ``ACCELERATE_MIXED_PRECISION`` or ``drivetrain launch --mixed_precision``
            (else ``"no"``).
        gradient_accumulation_steps: batches per optimizer step (use with :meth:`accumulate`); by
            default ``ACCELERATE_GRADIENT_ACCUMULATION_STEPS`` or ``drivetrain launch
            --gradient_accumulation_steps`` (else 1).
        cpu: run on the CPU (``accelerator="cpu"``); under a launcher it still joins all processes.
            ``ACCELERATE_USE_CPU=1`` means the same while ``accelerator`` is ``"auto"``.
        dataloader_config: a :class:`~drivetrain.utils.DataLoaderConfiguration`.
        rng_types: generators to synchronise at each epoch start besides the sampler's own:
            ``"torch"``, ``"cuda"``, ``"xpu"``, ``"mps"``, ``"generator"``.
        log_with: trackers: ``"tensorboard"``, ``"csv"``, ``"wandb"``, ``"mlflow"``, ``"all"`` (every
            installed one), drivetrain loggers, or a list (the same values as ``Trainer(logger=...)``),
            and instances of your :class:`~drivetrain.tracking.GeneralTracker` subclasses.
        project_dir: where logs and automatic checkpoints go.
        project_config: where logs and automatic checkpoints go, and how checkpoints are named and kept
            (a :class:`~drivetrain.utils.ProjectConfiguration`).
        gradient_accumulation_plugin: a :class:`~drivetrain.utils.GradientAccumulationPlugin`.
        step_scheduler_with_optimizer: step prepared schedulers with the optimizer (``False``: on
            every call, for epoch-based schedules).
        kwargs_handlers: ``DistributedDataParallelKwargs``, ``GradScalerKwargs``,
            ``InitProcessGroupKwargs``, ``AutocastKwargs`` (only changed fields are applied). They
            become :func:`drivetrain.connect`'s ``strategy_options`` (DDP and process-group
            settings, for a strategy given by name) and ``precision_options`` (``scaler_kwargs``,
            ``autocast_kwargs``); one process needs no DDP settings, and a precision without a
            loss scaler or autocast ignores those with a warning.
        fp16: ``True`` means ``mixed_precision="fp16"`` (Accelerate's older spelling).
        dispatch_batches: as in ``DataLoaderConfiguration``.
        even_batches: as in ``DataLoaderConfiguration``.
        deepspeed_plugin: not taken: a ``ValueError`` naming ``strategy="deepspeed_stage_2"`` (or a
            ``DeepSpeedStrategy``) instead.
        fsdp_plugin: not taken: a ``ValueError`` naming ``strategy="fsdp"`` (or an ``FSDPStrategy``).
        megatron_lm_plugin: not taken (Megatron-LM is not supported): a ``ValueError``.
        parallelism_config: a :class:`~drivetrain.ParallelismConfig` (``dp_replicate_size``,
            ``dp_shard_size``, ``tp_size``, ``cp_size``): tensor parallel x FSDP2 (HSDP when
            replicated) on one device mesh (``strategy="model_parallel"``).
        tp_plan: with ``tp_size > 1``, the ``parallelize_module`` plan ``prepare`` applies to the
            model (module path -> ``ColwiseParallel()`` … or ``"colwise"``/``"rowwise"``).
        dynamo_backend: compile every model ``prepare`` returns with ``torch.compile`` on this
            backend (``"inductor"``, ``"aot_eager"``, ``"eager"`` … or a
            :class:`~drivetrain.utils.DynamoBackend`; ``"no"``: do not); default
            ``ACCELERATE_DYNAMO_BACKEND`` or ``drivetrain launch --dynamo_backend`` (else ``"no"``).
        dynamo_plugin: a :class:`~drivetrain.utils.TorchDynamoPlugin` with all of ``torch.compile``'s
            settings (instead of ``dynamo_backend``); its unset fields come from ``ACCELERATE_DYNAMO_*``.
        debug: check, before every collective (``gather``, ``reduce``, ``wait_for_everyone`` …),
            that all processes call the same one with tensors of the same shapes and dtypes, and
            raise :class:`~drivetrain.utils.DistributedOperationException` naming them if not
            (default: ``ACCELERATE_DEBUG_MODE``). Costs a round trip to the rendezvous store per
            collective.
        accelerator: the hardware: ``"auto"``, a registered name or an instance.
        strategy: how the work is distributed: ``"auto"``, a registered name or a Strategy.
        devices: how many devices, or which (``None``: ``"auto"``).
        num_nodes: how many machines the job spans.
        precision: a precision name (``"bf16-mixed"`` …) or a Precision; instead of ``mixed_precision``.
        plugins: Precision, CheckpointIO and ClusterEnvironment instances.

    Raises:
        TypeError: a setting of the wrong type, with how to fix it.
        ValueError: a setting that cannot work, with how to fix it.
    """

    @refuse_retired_arguments(RETIRED_ACCELERATOR_ARGUMENTS)
    def __init__(
        self,
        *,
        device_placement: bool = True,
        split_batches: bool | None = None,
        mixed_precision: str | None = None,
        gradient_accumulation_steps: int | None = None,
        cpu: bool = False,
        dataloader_config: DataLoaderConfiguration | None = None,
        rng_types: Sequence[str] | None = None,
        log_with: Any = None,
        project_dir: str | os.PathLike[str] | None = None,
        project_config: ProjectConfiguration | None = None,
        gradient_accumulation_plugin: GradientAccumulationPlugin | None = None,
        step_scheduler_with_optimizer: bool = True,
        kwargs_handlers: Sequence[Any] | None = None,
        dynamo_backend: DynamoBackend | str | None = None,
        dynamo_plugin: TorchDynamoPlugin | None = None,
        fp16: bool | None = None,
        dispatch_batches: bool | None = None,
        even_batches: bool | None = None,
        accelerator: str | HardwareAccelerator = "auto",
        strategy: str | Strategy = "auto",
        devices: int | str | Sequence[int] | None = None,
        num_nodes: int = 1,
        precision: str | int | Precision | None = None,
        plugins: PluginInput | Sequence[PluginInput] | None = None,
        deepspeed_plugin: Any = None,
        fsdp_plugin: Any = None,
        megatron_lm_plugin: Any = None,
        parallelism_config: ParallelismConfig | None = None,
        tp_plan: dict[str, Any] | None = None,
        debug: bool | None = None,
    ) -> None:
        from drivetrain.strategies.rng import validate_rng_types
        from drivetrain.utils.configuration import check_flag

        settings.reject_plugins(deepspeed_plugin, fsdp_plugin, megatron_lm_plugin)
        strategy, parallelism_options = settings.parallelism(strategy, parallelism_config, tp_plan)
        #: Accelerate's parallel layout (``None`` unless given).
        self.parallelism_config = parallelism_config
        # Accelerate's environment variables are defaults; the arguments given here win.
        environment = accelerate_variables()
        if mixed_precision is None and fp16 is None and precision is None:
            mixed_precision = environment.mixed_precision
        if gradient_accumulation_steps is None and gradient_accumulation_plugin is None:
            gradient_accumulation_steps = environment.gradient_accumulation_steps
        if environment.use_cpu and not cpu and isinstance(accelerator, str) and accelerator == "auto":
            cpu = True
        #: Whether every collective first checks that all processes call it alike.
        self.debug = settings.debug_mode(debug, environment.debug_mode)
        check_flag("device_placement", device_placement)
        check_flag("step_scheduler_with_optimizer", step_scheduler_with_optimizer)
        data_config = settings.data_config(dataloader_config, split_batches, dispatch_batches, even_batches)
        checked_rng_types = validate_rng_types(rng_types)
        self.project_configuration = settings.project_config(project_config, project_dir)
        gradient_state = settings.gradient_state(gradient_accumulation_steps, gradient_accumulation_plugin)
        handlers = settings.sort_handlers(kwargs_handlers)
        self.autocast_handler = handlers.autocast
        self.profile_handler = handlers.profile
        log_with = tracking.check_log_with(log_with)
        strategy_built = settings.build_strategy(
            accelerator=settings.choose_accelerator(accelerator, cpu),
            strategy=strategy,
            devices=devices,
            num_nodes=num_nodes,
            precision=settings.choose_precision(mixed_precision, fp16, precision),
            plugins=plugins,
            handlers=handlers,
            debug=self.debug,
            parallelism_options=parallelism_options,
        )
        #: How ``prepare`` compiles models (``state.dynamo_plugin``; backend ``NO``: not at all).
        self.dynamo_plugin = settings.dynamo_settings(
            dynamo_backend, dynamo_plugin, environment, strategy_built
        )
        # The settings prepare() compiles with, or None: it then compiles nothing (and checks nothing).
        compiling = self.dynamo_plugin if self.dynamo_plugin.compiles else None
        objects = PreparedObjects()
        super().__init__(
            strategy=strategy_built,
            gradient_state=gradient_state,
            dataloader_config=data_config,
            objects=objects,
            device_placement=device_placement,
            rng_types=checked_rng_types,
            step_scheduler_with_optimizer=step_scheduler_with_optimizer,
            compiling=compiling,
            # strategy="auto": the first model prepared for training is weighed against DDP (see preparation.py).
            size_auto_strategy=isinstance(strategy, str) and strategy == "auto",
        )
        # The services that save, load and track, sharing the registry of prepared objects.
        self._checkpoints = StateCheckpoints(
            strategy_built, objects, self.project_configuration, gradient_state, self._require_processes
        )
        self._saver = ModelSaver(strategy_built, objects, self.project_configuration, compiling)
        self._tracking = Trackers(strategy_built, log_with, self.project_configuration)
        self._warned_accumulate = False
        # The strategy picks the backward call (the plain ``loss.backward()`` where it adds nothing).
        self._backward = self.strategy.step_functions().backward
        self._waiting_for_launch = self._start_processes()
        current.set_current(self)  # the free functions of drivetrain.utils act on the latest Accelerator

    # -- processes ----------------------------------------------------------------------------
    def _start_processes(self) -> bool:
        """Join or start this run's processes; True when they must be started by :meth:`launch`."""
        strategy = self.strategy
        launcher = strategy.launcher
        environment = strategy.cluster_environment
        if launcher is None or (environment is not None and environment.creates_processes_externally):
            _set_up(self)
            return False
        if not launcher.runs_in_spawned_processes:
            # Starts the other ranks (the script launcher re-runs this script); this process continues as rank 0.
            launcher.launch(_set_up, self)
            return False
        return True

    def launch(self, function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run ``function(*args, **kwargs)`` in every process; returns rank 0's result.

        Needed for strategies that start processes with a function (``"ddp_spawn"``,
        ``"ddp_fork"``, ``"ddp_notebook"``); elsewhere the processes already run and the function
        is simply called. With ``"ddp_spawn"`` pass the accelerator as an argument
        (``accelerator.launch(train, accelerator)``): the new processes receive a copy of it.
        """
        if not self._waiting_for_launch:
            return function(*args, **kwargs)
        launcher = self.strategy.launcher
        assert launcher is not None
        return launcher.launch(_run_in_process, self, function, args, kwargs)

    def _require_processes(self, what: str) -> None:
        if self._waiting_for_launch:
            raise RuntimeError(
                f"Accelerator.{what}() needs the run's processes, which strategy={type(self.strategy).__name__} "
                f"(start_method={getattr(self.strategy, 'start_method', '?')!r}) starts with a function: put the "
                f"training code in a function and run it with accelerator.launch(train_function, ...), or use "
                f"strategy='ddp' (the default), which re-runs the script."
            )

    # -- what the run looks like ----------------------------------------------------------
    @property
    def state(self) -> AcceleratorState:
        """This Accelerator's :class:`~drivetrain.facade.AcceleratorState` (a view of its processes)."""
        state = self.__dict__.get("_state")
        if state is None:
            state = self.__dict__["_state"] = AcceleratorState._view(self)
        return state

    @property
    def torch_device_mesh(self) -> Any:
        """The torch ``DeviceMesh`` of a ``parallelism_config`` run (see ``docs/model-parallel.md``
        for its dimensions; ``["tensor_parallel"]`` is the tensor-parallel mesh); else ``None``."""
        return self.strategy.layout_mesh

    @property
    def distributed_type(self) -> DistributedType:
        """Accelerate's name for how the processes are organised (``state.distributed_type``)."""
        return self.state.distributed_type

    @property
    def mixed_precision(self) -> str:
        """``"no"``, ``"fp16"``, ``"bf16"``, or drivetrain's name for other precisions."""
        name = self.strategy.precision.name
        return {"32-true": "no", "16-mixed": "fp16", "bf16-mixed": "bf16"}.get(name, name)

    @property
    def split_batches(self) -> bool:
        return self.dataloader_config.split_batches

    @property
    def even_batches(self) -> bool:
        return self.dataloader_config.even_batches

    @property
    def dispatch_batches(self) -> bool | None:
        return self.dataloader_config.dispatch_batches

    @property
    def project_dir(self) -> str | None:
        return self.project_configuration.project_dir

    @property
    def logging_dir(self) -> str | None:
        return self.project_configuration.logging_dir

    @property
    def save_iteration(self) -> int:
        """The number the next automatic checkpoint gets."""
        return self.project_configuration.iteration

    @property
    def gradient_accumulation_steps(self) -> int:
        return self.gradient_state.num_steps

    @gradient_accumulation_steps.setter
    def gradient_accumulation_steps(self, steps: int) -> None:
        self.gradient_state.num_steps = check_accumulation_steps(steps)

    @property
    def sync_gradients(self) -> bool:
        """False while gradients are being accumulated (optimizer steps are skipped)."""
        return self.gradient_state.sync_gradients

    @sync_gradients.setter
    def sync_gradients(self, value: bool) -> None:
        self.gradient_state.sync_gradients = bool(value)

    @property
    def step(self) -> int:
        """Batches accumulated since the last optimizer step."""
        return self.gradient_state.step

    @property
    def optimizer_step_was_skipped(self) -> bool:
        """Whether the latest optimizer step was skipped (fp16 gradients overflowed)."""
        return any(optimizer.step_was_skipped for optimizer in self._objects.optimizers)

    # -- the training step -------------------------------------------------------------------
    def backward(self, loss: Tensor, **kwargs: Any) -> None:
        """``loss.backward()`` through the strategy (loss scaling), divided by the accumulation steps."""
        state = self.gradient_state
        if state.num_steps != 1:
            if not self._warned_accumulate and not state.accumulate_called:
                self._warned_accumulate = True
                warnings.warn(
                    f"gradient_accumulation_steps={state.num_steps}, but the loop does not use `with accelerator."
                    f"accumulate(model):`, so the optimizer steps at every batch with the loss divided by "
                    f"{state.num_steps}. Wrap the step in accelerator.accumulate(model).",
                    UserWarning,
                    stacklevel=2,
                )
            loss = state.scale_loss(loss)
        try:
            self._backward(loss, self._objects.backward_module, **kwargs)
        except AttributeError:
            if isinstance(loss, Tensor):
                raise
            raise TypeError(
                f"accelerator.backward() expects the loss tensor, got {type(loss).__name__} ({loss!r}). Pass the "
                f"tensor your loss function returned (not loss.item() or a number)."
            ) from None

    def accumulate(self, *models: nn.Module) -> AbstractContextManager[Any]:
        """Context for one batch of gradient accumulation.

        Counts the batch; unless it completes ``gradient_accumulation_steps`` batches (or is the
        data loader's last), gradients are not all-reduced and prepared optimizers and schedulers
        skip their steps. The rules are the core's step policy, which the Trainer follows too.
        """
        state = self.gradient_state
        state.accumulate_called = True
        state.advance(state.loaders.end_of_dataloader)
        return state.backward_context(self.strategy, models)

    def no_sync(self, model: nn.Module) -> AbstractContextManager[Any]:
        """Context in which backward passes do not all-reduce ``model``'s gradients."""
        return self.strategy.no_backward_sync(model)

    @contextmanager
    def profile(self, profile_handler: ProfileKwargs | None = None) -> Iterator[Any]:
        """Profile the block with ``torch.profiler``; yields the profiler (call ``.step()`` per step
        when a schedule is set).

        Args:
            profile_handler: a :class:`~drivetrain.utils.ProfileKwargs`; default: the one given in
                ``kwargs_handlers``, else the CPU and this process's device, nothing else recorded.
                With ``output_trace_dir`` each process writes its Chrome trace there
                (``profile_<rank>.json``), and the processes wait for each other afterwards.
        """
        from drivetrain.facade.profiling import profiler_for

        handler = profile_handler or self.profile_handler
        with profiler_for(handler, self.device) as profiler:
            yield profiler
        if handler is not None and handler.output_trace_dir is not None:
            path = os.path.join(handler.output_trace_dir, f"profile_{self.process_index}.json")
            os.makedirs(handler.output_trace_dir, exist_ok=True)
            profiler.export_chrome_trace(path)
            self.wait_for_everyone()

    def trigger_sync_in_backward(self, model: nn.Module) -> AbstractContextManager[Any]:
        """Context in which the next backward pass all-reduces ``model``'s gradients, even inside
        :meth:`no_sync` (e.g. when another model's backward runs in between)."""
        return self.strategy.force_backward_sync(model)

    @property
    def scaler(self) -> Any:
        """The loss scaler (``torch.amp.GradScaler``) of fp16 mixed precision, else ``None``."""
        return getattr(self.strategy.precision, "scaler", None)

    @property
    def native_amp(self) -> bool:
        """Whether torch's automatic mixed precision (autocast) runs the forward passes."""
        from drivetrain.plugins.precision.amp import MixedPrecision

        return isinstance(self.strategy.precision, MixedPrecision)

    def autocast(self, autocast_handler: AutocastKwargs | None = None) -> AbstractContextManager[Any]:
        """The precision's forward context (autocast for mixed precision), for code outside ``forward``."""
        from drivetrain.plugins.precision.amp import MixedPrecision
        from drivetrain.plugins.precision.fp8 import Float8Precision

        precision = self.strategy.precision
        if autocast_handler is None:
            return precision.forward_context()
        if not isinstance(precision, (MixedPrecision, Float8Precision)):
            warnings.warn(
                f"autocast({autocast_handler!r}) has no effect: precision {precision.name!r} does not autocast.",
                UserWarning,
                stacklevel=2,
            )
            return precision.forward_context()
        return precision.forward_context(**autocast_handler.to_kwargs())

    def clip_grad_norm_(
        self, parameters: Iterable[Tensor] | Tensor, max_norm: float, norm_type: float = 2
    ) -> Tensor:
        """Clip the gradients' total norm (unscaling fp16 gradients first); returns the norm before clipping.

        An inf/NaN norm is left to the fp16 loss scaler, which skips the step; without a loss
        scaler it raises ``RuntimeError`` before the weights are touched (as in the Trainer).
        """
        check_clip_value(max_norm, "max_norm")
        params = _parameter_list(parameters, "clip_grad_norm_")
        owner, model = self._optimizer_of(params)
        if owner is not None and model is not None:
            norm = clip_gradients(self.strategy, model, owner.optimizer, max_norm, "norm", norm_type)
            assert norm is not None
            return norm
        self._check_clip_target("clip_grad_norm_")
        norm = unscale_and_clip(
            self.strategy.precision, self._all_optimizers(), params, max_norm, "norm", norm_type
        )
        assert norm is not None
        return norm

    def clip_grad_value_(self, parameters: Iterable[Tensor] | Tensor, clip_value: float) -> None:
        """Clip every gradient to ``[-clip_value, clip_value]`` (unscaling fp16 gradients first)."""
        check_clip_value(clip_value, "clip_value")
        params = _parameter_list(parameters, "clip_grad_value_")
        owner, model = self._optimizer_of(params)
        if owner is not None and model is not None:
            clip_gradients(self.strategy, model, owner.optimizer, clip_value, "value")
            return
        self._check_clip_target("clip_grad_value_")
        unscale_and_clip(self.strategy.precision, self._all_optimizers(), params, clip_value, "value")

    def _all_optimizers(self) -> list[Optimizer]:
        return [optimizer.optimizer for optimizer in self._objects.optimizers]

    def _optimizer_of(self, params: list[Tensor]) -> tuple[PreparedOptimizer | None, nn.Module | None]:
        """The prepared optimizer of exactly ``params``, and its model, so the strategy can clip."""
        ids = {id(p) for p in params}
        for optimizer in self._objects.optimizers:
            if ids == {id(p) for group in optimizer.param_groups for p in group["params"]}:
                return optimizer, optimizer._model or self._objects.backward_module
        return None, None

    def _check_clip_target(self, what: str) -> None:
        if self.strategy.requires_joint_setup:
            raise ValueError(
                f"{what} with {type(self.strategy).__name__} needs exactly the parameters of one prepared optimizer "
                f"(usually model.parameters())."
            )

    def unscale_gradients(self, optimizer: Optimizer | list[Optimizer] | None = None) -> None:
        """Divide fp16 gradients by the loss scale (before looking at them); safe to call twice."""
        chosen = (
            self._objects.optimizers
            if optimizer is None
            else optimizer
            if isinstance(optimizer, list)
            else [optimizer]
        )
        for opt in chosen:
            self.strategy.precision.unscale_gradients(
                opt.optimizer if isinstance(opt, PreparedOptimizer) else opt
            )

    # -- saving, loading and tracking (their services share the registry of prepared objects) ----
    @property
    def trackers(self) -> list[Any]:
        """The started trackers (empty off the main process and before :meth:`init_trackers`)."""
        return self._tracking.trackers

    def register_for_checkpointing(self, *objects: Any) -> None:
        """Save and restore these objects (each with ``state_dict``/``load_state_dict``) in save/load_state.

        Raises:
            ValueError: an object without ``state_dict()`` and ``load_state_dict()`` (as Accelerate).
        """
        self._checkpoints.register_for_checkpointing(*objects)

    def save_state(
        self, output_dir: str | os.PathLike[str] | None = None, safe_serialization: bool = True, **kwargs: Any
    ) -> str:
        """Save models, optimizers, schedulers, loss scaler, RNG states, data positions and registered objects.

        Without ``output_dir`` the next automatic checkpoint is written
        (``ProjectConfiguration(automatic_checkpoint_naming=True)``), and checkpoints beyond
        ``total_limit`` are removed once it is complete. The state is read with
        ``weights_only=True`` either way, so ``safe_serialization`` changes nothing.

        Returns:
            The directory written.
        """
        return self._checkpoints.save_state(output_dir, safe_serialization, **kwargs)

    def load_state(
        self,
        input_dir: str | os.PathLike[str] | None = None,
        load_kwargs: dict[str, Any] | None = None,
        *,
        map_location: str | None = None,
        **kwargs: Any,
    ) -> str:
        """Restore what :meth:`save_state` saved; prepared loaders continue with the next unseen batch.

        Args:
            input_dir: the directory :meth:`save_state` wrote; ``None`` loads the newest complete
                automatic checkpoint.
            load_kwargs: ``{"weights_only": False}`` unpickles the state without restrictions,
                which can run code from the files: only for checkpoints from a trusted source.
                By default only tensors, plain values and allow-listed classes are read.
            map_location: where saved tensors are read to before they are restored:
                ``"cpu"`` or ``"on_device"`` (this process's device); by default where they were
                saved from. Sharded states are read straight into the live shards.

        Each process may pass its own directory (one per process, as it gave to
        :meth:`save_state`): every process then restores its own generators and loader
        positions from it, and the shared state from the main process's directory.

        A folder that a killed :meth:`save_state` left without its state (what a "load the
        newest folder" resume finds after a crash) is passed over, with a warning, for the newest
        folder beside it that holds a complete state.

        Returns:
            The directory loaded.
        """
        return self._checkpoints.load_state(input_dir, load_kwargs, map_location=map_location, **kwargs)

    def register_save_state_pre_hook(
        self, hook: Callable[[list[nn.Module], list[dict[str, Any]], str], None]
    ) -> Any:
        """Call ``hook(models, weights, output_dir)`` at the start of every :meth:`save_state`.

        ``weights`` holds each prepared model's state dict; the hook may change them, or remove
        entries (and save those models its own way): what is left in ``weights`` is saved as the
        models' state. Returns a handle whose ``remove()`` unregisters the hook.
        """
        return self._checkpoints.register_save_state_pre_hook(hook)

    def register_load_state_pre_hook(self, hook: Callable[[list[nn.Module], str], None]) -> Any:
        """Call ``hook(models, input_dir)`` at the start of every :meth:`load_state`.

        ``models`` lists the prepared models; a hook that loads some itself removes them, and the
        rest are loaded from the state (so remove the same ones its save hook removed). Returns a
        handle whose ``remove()`` unregisters the hook.
        """
        return self._checkpoints.register_load_state_pre_hook(hook)

    def unwrap_model(
        self, model: nn.Module, keep_fp32_wrapper: bool = True, keep_torch_compile: bool = True
    ) -> nn.Module:
        """The user's module inside the strategy's wrappers (DDP, ``nn.DataParallel``, DeepSpeed …).

        Args:
            model: a prepared module (or any module).
            keep_fp32_wrapper: ``False`` also takes off the precision's forward wrapper (autocast).
            keep_torch_compile: return a ``torch.compile`` module around the user's module when
                ``model`` is compiled (``False``: the user's module itself). For a model this
                Accelerator compiled around a DDP wrapper that is a compiled module of its own
                (made once, with the same settings), so the prepared model keeps its wrapper.
        """
        return self._saver.unwrap_model(model, keep_fp32_wrapper, keep_torch_compile)

    def get_state_dict(self, model: nn.Module, unwrap: bool = True) -> dict[str, Any]:
        """``model``'s state dict as the strategy assembles it (whole, even when sharded), with the
        model's own parameter names (no ``module.`` or ``_orig_mod.`` of a wrapper).

        A model whose weights are offloaded to CPU RAM or disk (``dispatch_model``, ``cpu_offload``,
        ``disk_offload``) gives its weights read in from there, on the CPU.
        """
        return self._saver.get_state_dict(model, unwrap)

    def save(self, obj: Any, f: str | os.PathLike[str], safe_serialization: bool = False) -> None:
        """Save ``obj`` once (main process; each node's with ``save_on_each_node``), atomically."""
        self._saver.save(obj, f, safe_serialization)

    def save_model(
        self,
        model: nn.Module,
        save_directory: str | os.PathLike[str],
        max_shard_size: int | str = "10GB",
        safe_serialization: bool = True,
    ) -> None:
        """Save ``model``'s weights to ``save_directory`` (``model.safetensors``, sharded past ``max_shard_size``)."""
        self._saver.save_model(model, save_directory, max_shard_size, safe_serialization)

    def init_trackers(
        self,
        project_name: str,
        config: dict[str, Any] | None = None,
        init_kwargs: dict[str, Any] | None = None,
    ) -> None:
        """Build and start the ``log_with`` trackers (main process only) and record ``config`` in each.

        Args:
            project_name: the experiment: named trackers write under ``logging_dir/project_name``.
            config: hyperparameters, given to each tracker's ``store_init_configuration``.
            init_kwargs: tracker name -> the keyword arguments its constructor gets
                (``{"wandb": {"entity": "me"}}``).
        """
        self._tracking.init_trackers(project_name, config, init_kwargs)

    def log(
        self, values: dict[str, Any], step: int | None = None, log_kwargs: dict[str, Any] | None = None
    ) -> None:
        """Give ``values`` at ``step`` to every tracker's ``log`` on the main process.

        Args:
            values: the values; drivetrain's trackers take numbers and one-element tensors (nested
                dicts become ``a/b`` names), TensorBoard's strings too; your own trackers get them as given.
            step: the step they belong to.
            log_kwargs: tracker name -> keyword arguments for that tracker's ``log``.

        Raises:
            RuntimeError: before ``init_trackers``.
            ValueError: ``log_kwargs`` for a tracker that is not started.
        """
        self._tracking.log(values, step, log_kwargs)

    def get_tracker(self, name: str, unwrap: bool = False) -> Any:
        """The started tracker called ``name`` (``"wandb"``, your tracker's ``name`` …).

        Args:
            name: the tracker's ``name``; a logger's class name (``"WandbLogger"``) works too.
            unwrap: return what it writes through (its ``tracker``): the ``SummaryWriter``, the W&B
                run, the ``MlflowClient`` (Accelerate returns the active MLflow run there).

        Off the main process, where no tracker runs, a blank tracker whose methods do nothing (as
        in Accelerate), so ``get_tracker("wandb").log(...)`` runs on every rank.

        Raises:
            ValueError: (main process) no started tracker has that name.
        """
        return self._tracking.get_tracker(name, unwrap)

    def end_training(self) -> None:
        """Finish the trackers, ending their runs (call at the end of the script).

        Unlike Accelerate's, it leaves the process group alone (drivetrain releases it when the
        process exits), so waiting, gathering and saving after it still work.
        """
        self._tracking.end_training()

    def __repr__(self) -> str:
        return (
            f"Accelerator(strategy={type(self.strategy).__name__}, device={self.device}, "
            f"num_processes={self.num_processes}, mixed_precision={self.mixed_precision!r})"
        )


def _set_up(accelerator: Accelerator) -> None:
    """Set up this process for the accelerator's strategy (the strategy releases its group at exit)."""
    accelerator.strategy.setup_environment()


def _run_in_process(
    accelerator: Accelerator, function: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """The body of each process started by :meth:`Accelerator.launch`."""
    accelerator._waiting_for_launch = False
    _set_up(accelerator)
    current.set_current(accelerator)
    return function(*args, **kwargs)


def _parameter_list(parameters: Iterable[Tensor] | Tensor, method: str) -> list[Tensor]:
    """The tensors whose gradients ``method`` clips; a model or a number is a ``TypeError`` that says what to pass."""
    if isinstance(parameters, Tensor):
        return [parameters]
    try:
        return list(parameters)
    except TypeError:
        fix = (
            "model.parameters()"
            if isinstance(parameters, nn.Module)
            else "model.parameters() or a list of tensors"
        )
        raise TypeError(
            f"{method}() clips the gradients of parameters: it takes an iterable of parameters, got "
            f"{type(parameters).__name__}. Pass {fix}."
        ) from None


# What PartialState() and AcceleratorState() view when no Accelerator exists yet: one made on demand, kept for
# the process's lifetime (its processes are joined once, a process group per process).
_implicit: list[Accelerator] = []


def _implicit_accelerator(cpu: bool) -> Accelerator:
    _implicit.append(Accelerator(cpu=cpu))
    return _implicit[-1]


current.set_implicit_owner_factory(_implicit_accelerator)

__all__ = ["Accelerator", "AcceleratorState", "PartialState"]
