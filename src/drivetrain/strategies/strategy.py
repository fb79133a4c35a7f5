"""The Strategy interface: how model, optimizers and data are placed and synchronised.

A Strategy owns four plugins: the hardware :class:`~drivetrain.accelerators.Accelerator`, the
:class:`~drivetrain.plugins.precision.Precision`, the
:class:`~drivetrain.plugins.io.CheckpointIO` and, for parallel strategies, the
:class:`~drivetrain.plugins.environments.ClusterEnvironment`. Front doors talk to hardware only
through it. Every method on the per-step path (``backward``, ``optimizer_step``,
``batch_to_device``) is a thin call into a plugin.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager, ExitStack, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import torch
from torch import Tensor, nn
from torch.optim import Optimizer

from drivetrain._utilities.apply import device_mover, move_to_device
from drivetrain.plugins.io.checkpoint_io import CheckpointIO
from drivetrain.plugins.precision.precision import Precision
from drivetrain.strategies.capabilities import StrategyCapabilities
from drivetrain.strategies.module_init import skip_parameter_init
from drivetrain.strategies.state_dicts import checkpoint_into_state, read_through, state_to_checkpoint
from drivetrain.strategies.step_policy import (
    StepFunctions,
    explain_backward_failure,
    plain_backward,
    plain_optimizer_step,
    unscale_and_clip,
)

if TYPE_CHECKING:
    from drivetrain.accelerators.accelerator import Accelerator
    from drivetrain.plugins.environments.cluster_environment import ClusterEnvironment
    from drivetrain.strategies.launchers.launcher import Launcher
    from drivetrain.strategies.preemption import PreemptionWatch

M = TypeVar("M", bound=nn.Module)

#: ``reduce_op`` names accepted by :meth:`Strategy.all_reduce`.
REDUCE_OPS = ("sum", "mean", "max", "min", "product")


class Strategy(StrategyCapabilities):
    """Base class of every strategy; on its own it runs one process on one device.

    What it can do (``kind``, ``owns_accumulation``, ``requires_joint_setup`` …) is declared in
    :class:`~drivetrain.strategies.capabilities.StrategyCapabilities`, which the front doors read.

    Args:
        accelerator: the hardware plugin (set by :func:`drivetrain.connect` when omitted).
        checkpoint_io: how checkpoints are written and read (``TorchCheckpointIO`` when omitted).
        precision: the precision plugin (``"32-true"`` when omitted).
        precision_plugin: the same as ``precision``, under the name Lightning's docs use.
    """

    #: The stop-signal watch of the run in progress (see :meth:`preemption_watch`), if any.
    preemption: PreemptionWatch | None = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "register_strategies" in cls.__dict__:
            from drivetrain.strategies.registry import StrategyRegistry

            cls.register_strategies(StrategyRegistry)

    def __init__(
        self,
        accelerator: Accelerator | None = None,
        checkpoint_io: CheckpointIO | None = None,
        precision: Precision | None = None,
        *,
        precision_plugin: Precision | None = None,
    ) -> None:
        if precision is not None and precision_plugin is not None and precision is not precision_plugin:
            raise ValueError(
                f"{type(self).__name__} got both precision={precision!r} and "
                f"precision_plugin={precision_plugin!r}; they are the same setting, pass only one."
            )
        _check_type("accelerator", accelerator, "drivetrain.accelerators.Accelerator", _accelerator_type())
        _check_type("checkpoint_io", checkpoint_io, "drivetrain.plugins.CheckpointIO", CheckpointIO)
        _check_type("precision", precision or precision_plugin, "drivetrain.plugins.Precision", Precision)
        self._accelerator = accelerator
        self._checkpoint_io = checkpoint_io
        self._precision = precision if precision is not None else precision_plugin
        #: The module most recently given to :meth:`setup_module` (the seeds' ``self.model``).
        self.model: nn.Module | None = None

    # -- the plugins ------------------------------------------------------------------------
    @property
    def accelerator(self) -> Accelerator:
        if self._accelerator is None:
            raise RuntimeError(
                f"{type(self).__name__} has no accelerator yet. Pass accelerator=... or build the strategy "
                f"through drivetrain.connect(strategy=...), Trainer(...) or Accelerator(...)."
            )
        return self._accelerator

    @property
    def precision(self) -> Precision:
        if self._precision is None:
            self._precision = Precision()
        return self._precision

    @property
    def precision_plugin(self) -> Precision:
        """Alias of :attr:`precision` (Lightning's name)."""
        return self.precision

    @property
    def checkpoint_io(self) -> CheckpointIO:
        if self._checkpoint_io is None:
            from drivetrain.plugins.io.torch_io import TorchCheckpointIO

            self._checkpoint_io = TorchCheckpointIO()
        return self._checkpoint_io

    @property
    def cluster_environment(self) -> ClusterEnvironment | None:
        """Where the job runs (given by :func:`drivetrain.connect`); a one-process job still asks it
        about preemption (its requeue signal)."""
        return self._connected_environment

    _connected_environment: ClusterEnvironment | None = None

    def given_plugins(self) -> dict[str, Any]:
        """The plugins this strategy holds before :func:`drivetrain.connect` wires it, by kind.

        Keys among ``"accelerator"``, ``"precision"``, ``"checkpoint_io"`` and
        ``"cluster_environment"``; a kind left out is for ``connect()`` to choose. ``connect()``
        keeps these, and reports a kind given here and again in its own arguments as an error.
        Override it if your strategy keeps its plugins somewhere other than the constructor's
        arguments.
        """
        given = {
            "accelerator": self._accelerator,
            "precision": self._precision,
            "checkpoint_io": self._checkpoint_io,
        }
        return {kind: plugin for kind, plugin in given.items() if plugin is not None}

    def given_devices(self) -> list[torch.device] | None:
        """The devices this strategy was built with, before :func:`drivetrain.connect` wires it.

        ``None`` (the default) leaves them to ``connect()`` (from ``devices=`` and the
        accelerator). Otherwise they fix the devices: ``connect()`` checks them against the
        accelerator (same device type) and against an explicit ``devices=`` (same count and
        indices), and picks the accelerator from their type under ``accelerator="auto"``.
        """
        return None

    def connect_plugins(
        self,
        *,
        accelerator: Accelerator,
        precision: Precision,
        checkpoint_io: CheckpointIO | None,
        cluster_environment: ClusterEnvironment | None,
        parallel_devices: list[torch.device],
        num_nodes: int,
    ) -> None:
        """Give the strategy the components :func:`drivetrain.connect` resolved.

        Called once, by ``connect()`` only, before the strategy is handed out; components the
        user already set on the strategy are kept (``connect()`` has checked they agree).
        """
        self._accelerator = self._accelerator or accelerator
        self._precision = self._precision or precision
        self._checkpoint_io = self._checkpoint_io or checkpoint_io
        self._connected_environment = cluster_environment

    def check_accelerator(self, accelerator: Accelerator) -> None:
        """Raise ``ValueError`` if this strategy cannot run on ``accelerator`` (called by ``connect()``)."""
        from drivetrain.accelerators.xla import XLAAccelerator

        if isinstance(accelerator, XLAAccelerator):
            raise ValueError(
                f"{type(self).__name__} cannot run on XLA devices; use strategy='xla' (or 'auto') with "
                f"accelerator='xla'."
            )

    # -- where this process stands --------------------------------------------------------
    @property
    def root_device(self) -> torch.device:
        """The device this process computes on."""
        raise NotImplementedError(f"{type(self).__name__} must define root_device")

    @property
    def global_rank(self) -> int:
        return 0

    @property
    def local_rank(self) -> int:
        return 0

    @property
    def node_rank(self) -> int:
        return 0

    @property
    def world_size(self) -> int:
        return 1

    @property
    def num_nodes(self) -> int:
        return 1

    @property
    def is_global_zero(self) -> bool:
        return self.global_rank == 0

    @property
    def launcher(self) -> Launcher | None:
        """How processes are started; ``None`` when this strategy runs in the current process only."""
        return None

    @property
    def distributed_sampler_kwargs(self) -> dict[str, int] | None:
        """``num_replicas``/``rank`` for a ``DistributedSampler``; ``None`` when data is not sharded."""
        return None

    # -- set-up ---------------------------------------------------------------------------
    def setup_environment(self) -> None:
        """Prepare the device (and, for parallel strategies, the process group) in this process."""
        self.accelerator.setup_device(self.root_device)

    def setup(self, trainer: Any = None) -> None:
        """Hook run by the Trainer after :meth:`setup_environment`; custom strategies override it."""
        self.accelerator.setup(trainer)

    def module_init_context(self, empty_init: bool | None = None) -> AbstractContextManager[Any]:
        """A context for building a model: on the target device, in the target precision.

        Args:
            empty_init: skip the initialisation of weights that will be overwritten anyway
                (loaded from a checkpoint, or materialised by a sharded strategy).
        """
        stack = ExitStack()
        if empty_init:
            stack.enter_context(skip_parameter_init())
        if self.root_device.type != "cpu":  # CPU is already the default; the device context costs per tensor
            stack.enter_context(self.root_device)
        stack.enter_context(self.precision.module_init_context())
        return stack

    def module_to_device(self, module: nn.Module) -> None:
        module.to(self.root_device)

    def connect(self, model: nn.Module) -> None:
        """Attach ``model`` before it is set up (Lightning's ``Strategy.connect``): it is :attr:`model` and
        :attr:`lightning_module` until :meth:`setup_module` wraps it. The Trainer connects its module itself."""
        if not isinstance(model, nn.Module):
            raise TypeError(
                f"{type(self).__name__}.connect(model) expects a torch.nn.Module (a TrainingModule), got "
                f"{type(model).__name__}."
            )
        self.model = model

    @property
    def lightning_module(self) -> nn.Module | None:
        """The user's module under :attr:`model`, whatever wraps it (Lightning's name; ``None`` before one is set)."""
        return self.unwrap_module(self.model) if self.model is not None else None

    def setup_module(self, module: nn.Module) -> nn.Module:
        """Wrap ``module`` for this strategy (DDP, FSDP …) and return what the user should call."""
        self.model = module
        return module

    def setup_optimizer(self, optimizer: Optimizer) -> Optimizer:
        """Adapt ``optimizer`` to the strategy (sharded strategies rebuild it)."""
        return optimizer

    def setup_module_and_optimizers(
        self, module: nn.Module, optimizers: list[Optimizer]
    ) -> tuple[nn.Module, list[Optimizer]]:
        """Set up a module with its optimizers (strategies such as DeepSpeed need both at once)."""
        module = self.setup_module(module)
        return module, [self.setup_optimizer(optimizer) for optimizer in optimizers]

    def process_dataloader(self, dataloader: Any) -> Any:
        return dataloader

    # -- the per-step path -----------------------------------------------------------------
    def batch_to_device(self, batch: Any, device: torch.device | None = None) -> Any:
        return move_to_device(batch, device or self.root_device)

    def batch_mover(self) -> Callable[[Any], Any] | None:
        """What puts each batch on :attr:`root_device` (the data loaders call it per batch).

        :meth:`batch_to_device` when a strategy overrides it; ``None`` on the CPU, where batches
        already are (nothing runs per step); otherwise a function that leaves batches already on
        the device alone after a few attribute reads and moves the rest (non-blocking).
        """
        if type(self).batch_to_device is not Strategy.batch_to_device:
            return self.batch_to_device
        device = self.root_device
        if device.type == "cpu":
            return None
        return device_mover(device, self.batch_to_device)

    def backward(self, tensor: Tensor, module: nn.Module | None = None, *args: Any, **kwargs: Any) -> None:
        precision = self.precision
        try:  # free unless it raises (Python 3.11+)
            tensor = precision.pre_backward(tensor, module)
            precision.backward(tensor, module, *args, **kwargs)
        except RuntimeError as error:
            explained = explain_backward_failure(error, tensor)
            if explained is None:
                raise
            raise explained from None  # torch's own traceback is the autograd engine's
        precision.post_backward(tensor, module)

    def optimizer_step(
        self,
        optimizer: Optimizer,
        closure: Callable[[], Any] | None = None,
        model: nn.Module | None = None,
        **kwargs: Any,
    ) -> Any:
        return self.precision.optimizer_step(optimizer, closure, **kwargs)

    def step_functions(self) -> StepFunctions:
        """The backward and optimizer-step callables the front doors call on every training step.

        The one fast path of the per-step path, chosen here: when neither this strategy nor its
        precision changes :meth:`backward` or :meth:`optimizer_step` (no loss scaling, no engine),
        they amount to ``loss.backward()`` and ``optimizer.step()``, and those plain calls are
        returned, which saves a few Python calls per step. Otherwise this strategy's own methods.
        Front doors ask once per run, after the strategy is set up.
        """
        precision = type(self.precision)
        backward: Callable[..., None] = self.backward
        optimizer_step: Callable[..., Any] = self.optimizer_step
        if (
            type(self).backward is Strategy.backward
            and precision.pre_backward is Precision.pre_backward
            and precision.backward is Precision.backward
            and precision.post_backward is Precision.post_backward
        ):
            backward = plain_backward
        if (
            type(self).optimizer_step is Strategy.optimizer_step
            and precision.optimizer_step is Precision.optimizer_step
        ):
            optimizer_step = plain_optimizer_step
        return StepFunctions(backward, optimizer_step)

    def no_backward_sync(self, module: nn.Module, enabled: bool = True) -> AbstractContextManager[Any]:
        """Skip gradient synchronisation in backward passes inside this context (accumulation)."""
        return nullcontext()

    def force_backward_sync(self, module: nn.Module) -> AbstractContextManager[Any]:
        """Synchronise gradients in the next backward pass even inside :meth:`no_backward_sync`.

        Nothing to do for strategies without gradient synchronisation (the default).
        """
        return nullcontext()

    def join(self, joinables: Sequence[Any], enable: bool = True) -> AbstractContextManager[Any] | None:
        """A context in which processes with fewer batches than others shadow their collectives.

        ``None`` when the strategy cannot join uneven inputs (the base strategy: one process has
        nobody to wait for). :class:`~drivetrain.strategies.DDPStrategy` uses torch's ``Join``.
        """
        return None

    def clip_gradients_norm(
        self,
        module: nn.Module,
        optimizer: Optimizer,
        max_norm: float,
        norm_type: float = 2.0,
        error_if_nonfinite: bool | None = None,
    ) -> Tensor:
        """Clip the gradients of ``optimizer``'s parameters to a total ``max_norm``; returns the norm.

        Gradients are unscaled first (fp16). ``error_if_nonfinite=None`` follows the precision: an
        inf/NaN norm is left to a loss scaler that skips the step, and raises otherwise (see
        :mod:`drivetrain.strategies.step_policy`).
        """
        precision = self.precision
        parameters = precision.main_params(optimizer)
        norm = unscale_and_clip(
            precision, [optimizer], parameters, max_norm, "norm", norm_type, error_if_nonfinite
        )
        assert norm is not None
        return norm

    def clip_gradients_value(self, module: nn.Module, optimizer: Optimizer, clip_val: float) -> None:
        precision = self.precision
        unscale_and_clip(precision, [optimizer], precision.main_params(optimizer), clip_val, "value")

    # -- collectives (identities on one process) ----------------------------------------------
    def all_reduce(self, tensor: Tensor, group: Any | None = None, reduce_op: str = "mean") -> Tensor:
        _check_reduce_op(reduce_op)
        return tensor

    def all_gather(self, tensor: Tensor, group: Any | None = None, sync_grads: bool = False) -> Tensor:
        """Stack ``tensor`` from every process along a new first dimension (size ``world_size``)."""
        return tensor.unsqueeze(0)

    def all_gather_object(self, obj: Any) -> list[Any]:
        return [obj]

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        return obj

    def barrier(self, name: str | None = None) -> None:
        """Wait until every process reaches this point."""

    def reduce_boolean_decision(self, decision: bool, all: bool = True) -> bool:
        """Combine a per-process decision: ``all=True`` needs every process to agree, else any one."""
        return decision

    # -- state -------------------------------------------------------------------------------
    def unwrap_module(self, module: nn.Module) -> nn.Module:
        """The user's module inside whatever the strategy (or ``torch.compile``) wrapped it in."""
        return unwrap_parallel(module)

    def get_module_state_dict(self, module: nn.Module) -> dict[str, Any]:
        return self.unwrap_module(module).state_dict()

    def load_module_state_dict(
        self, module: nn.Module, state_dict: dict[str, Any], strict: bool = True
    ) -> None:
        self.unwrap_module(module).load_state_dict(state_dict, strict=strict)

    def get_optimizer_state(self, optimizer: Optimizer) -> dict[str, Any]:
        return optimizer.state_dict()

    def load_optimizer_state(self, optimizer: Optimizer, state_dict: dict[str, Any]) -> None:
        optimizer.load_state_dict(state_dict)

    def save_state(self, path: str | Path, state: dict[str, Any], storage_options: Any | None = None) -> None:
        """Save live training state: the front doors' way to checkpoint under any strategy.

        Args:
            path: where the checkpoint goes (a file here; sharded strategies write a directory).
            state: names → modules, optimizers, objects with ``state_dict()``, or plain values.
                Modules and optimizers are converted by this strategy (sharded strategies gather
                or shard them), everything else as it is.
        """
        self.save_checkpoint(self._state_to_checkpoint(state), path, storage_options=storage_options)

    def load_state(
        self,
        path: str | Path,
        state: dict[str, Any] | None = None,
        strict: bool = True,
        *,
        weights_only: bool = True,
        map_location: Any | None = None,
    ) -> dict[str, Any]:
        """Load a checkpoint written by :meth:`save_state` into the live objects of ``state``.

        Modules, optimizers and objects with ``load_state_dict()`` in ``state`` are restored in
        place; plain values are replaced in ``state``. Returns the checkpoint's remaining entries
        (those not named in ``state``).

        Args:
            weights_only: read the checkpoint safely (tensors, containers, plain values and
                allow-listed classes only). ``False`` unpickles anything, which can run code from
                the file: only for checkpoints from a trusted source.
            map_location: where the file's tensors are read to before they are copied into the
                live objects (as for ``torch.load``; ``None``: where they were saved from).

        Raises:
            KeyError: ``strict`` and an entry of ``state`` is missing from the checkpoint.
            DamagedCheckpointError: the checkpoint is truncated, empty or not a checkpoint.
            UnsafeCheckpointError: it holds objects safe loading refuses.
        """
        checkpoint = self.load_checkpoint(path, map_location, weights_only=weights_only)
        return self._checkpoint_into_state(checkpoint, state if state is not None else {}, strict)

    def reads_checkpoint_whole(self, path: str | Path) -> bool:
        """Whether :meth:`load_state` reads the checkpoint at ``path`` as one dict (:meth:`load_checkpoint`)
        and restores the live objects from it.

        A front door may then read it first, let ``on_load_checkpoint`` hooks see and change the
        whole dict, and restore from what they leave. A strategy with a ``load_state`` of its own
        (sharded folders read straight into the live shards) says ``False`` unless it knows better.
        """
        return type(self).load_state is Strategy.load_state

    def _state_to_checkpoint(self, state: dict[str, Any]) -> dict[str, Any]:
        return state_to_checkpoint(self, state)

    def _checkpoint_into_state(
        self, checkpoint: dict[str, Any], state: dict[str, Any], strict: bool
    ) -> dict[str, Any]:
        return checkpoint_into_state(self, checkpoint, state, strict)

    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: str | Path, storage_options: Any | None = None
    ) -> None:
        """Write ``checkpoint`` through the CheckpointIO; only global rank 0 writes."""
        if self.is_global_zero:
            # User CheckpointIOs written after the seeds take (checkpoint, path) only.
            if storage_options is None:
                self.checkpoint_io.save_checkpoint(checkpoint, path)
            else:
                self.checkpoint_io.save_checkpoint(checkpoint, path, storage_options=storage_options)

    def load_checkpoint(
        self, path: str | Path, map_location: Any | None = None, *, weights_only: bool = True
    ) -> dict[str, Any]:
        """Read the checkpoint file at ``path`` through the CheckpointIO (safely unless ``weights_only=False``)."""
        return read_through(self.checkpoint_io, path, map_location, weights_only)

    def remove_checkpoint(self, path: str | Path) -> None:
        if self.is_global_zero:
            self.checkpoint_io.remove_checkpoint(path)

    def preemption_watch(self, signals: Iterable[int], position: Callable[[], int]) -> PreemptionWatch:
        """A watch on this run's stop signals: every rank stops at the same step boundary after one arrives.

        Args:
            signals: the signals that stop the run (``SIGTERM``, a cluster's requeue signal).
            position: how many step boundaries this process has passed.

        The front door installs it, asks ``watch.pending`` at each boundary and, once that is true,
        ``watch.stop_here()`` (see :mod:`drivetrain.strategies.preemption`). One process agrees with
        nobody; parallel strategies agree through the job's rendezvous store.
        """
        from drivetrain.strategies.preemption import PreemptionWatch

        self.preemption = PreemptionWatch(signals, position)
        return self.preemption

    def on_exception(self, exception: BaseException) -> None:
        """Called by the front doors and launchers when ``exception`` ends the run in this process.

        Parallel strategies tell the other ranks and stop entering collectives (see
        :meth:`ParallelStrategy.on_exception <drivetrain.strategies.ParallelStrategy.on_exception>`).
        """

    def teardown(self) -> None:
        """Release everything the strategy and its plugins took in this process."""
        self.precision.teardown()
        if self._accelerator is not None:
            self._accelerator.teardown()
        if self._checkpoint_io is not None:
            self._checkpoint_io.teardown()

    @classmethod
    def register_strategies(cls, strategy_registry: Any) -> None:
        """Register named presets of this class; see :class:`~drivetrain.strategies.StrategyRegistry`."""

    def __repr__(self) -> str:
        device = self.root_device if self._accelerator is not None else "unset"
        return f"{type(self).__name__}(device={device}, precision={self._precision!r})"


def unwrap_parallel(module: nn.Module) -> nn.Module:
    """``module`` without ``torch.compile``, ``DistributedDataParallel`` and ``nn.DataParallel`` around it."""
    while True:
        inner: Any = module
        if hasattr(inner, "_orig_mod"):  # torch.compile's OptimizedModule
            module = inner._orig_mod
        elif isinstance(module, (nn.parallel.DistributedDataParallel, nn.DataParallel)):
            module = inner.module
        else:
            return module


def _check_reduce_op(reduce_op: str) -> None:
    if reduce_op not in REDUCE_OPS:
        raise ValueError(f"reduce_op={reduce_op!r} is not supported; use one of {', '.join(REDUCE_OPS)}.")


def _accelerator_type() -> type:
    from drivetrain.accelerators.accelerator import Accelerator

    return Accelerator


def _check_type(argument: str, value: Any, expected_name: str, expected: type) -> None:
    if value is not None and not isinstance(value, expected):
        raise TypeError(
            f"{argument}= expects an instance of {expected_name}, got {type(value).__name__} ({value!r}). "
            f"Pass an instance (strings are resolved by drivetrain.connect, Trainer and Accelerator, "
            f"not by strategy constructors)."
        )
