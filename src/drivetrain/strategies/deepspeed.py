"""DeepSpeed ZeRO (stages 0-3, optimizer and parameter offload) on the real ``deepspeed`` package.

Needs the ``deepspeed`` extra (``pip install 'drivetrain[deepspeed]'``); DeepSpeed is imported
only when a DeepSpeed strategy sets up its environment, so ``import drivetrain`` stays cheap.
Presets: ``deepspeed`` (stage 2), ``deepspeed_stage_1``, ``deepspeed_stage_2``,
``deepspeed_stage_2_offload``, ``deepspeed_stage_3``, ``deepspeed_stage_3_offload``.

The engine replaces the module and the optimizer: :meth:`DeepSpeedStrategy.setup_module_and_optimizers`
returns ``(engine, [engine.optimizer])``; ``backward`` and ``optimizer_step`` call
``engine.backward`` and ``engine.step``. DeepSpeed's launcher appends ``--local_rank=N`` to the
script's arguments; :func:`drivetrain.cli.launcher_arguments.drop_launcher_arguments` removes it
before a parser sees it. ``docs/sharded-training.md`` is the user guide.
"""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any, Unpack

import torch
from torch import Tensor, nn
from torch.optim import Optimizer

from drivetrain._utilities import paths
from drivetrain._utilities.imports import require
from drivetrain.plugins.precision.deepspeed import DeepSpeedPrecision
from drivetrain.strategies import deepspeed_config as cfg
from drivetrain.strategies.parallel import ParallelStrategy
from drivetrain.strategies.process_group_options import ProcessGroupArguments

if TYPE_CHECKING:
    from drivetrain.accelerators.accelerator import Accelerator
    from drivetrain.plugins.environments.cluster_environment import ClusterEnvironment
    from drivetrain.plugins.io.checkpoint_io import CheckpointIO
    from drivetrain.plugins.precision.precision import Precision

__all__ = ["DeepSpeedStrategy"]

_FEATURE = "DeepSpeedStrategy (strategy='deepspeed…')"


class DeepSpeedStrategy(ParallelStrategy):
    """Train with a DeepSpeed engine: ZeRO-partitioned optimizer state, gradients and parameters.

    Args:
        stage: ZeRO stage: 0 (plain data parallel), 1 (optimizer state partitioned), 2 (+ gradients),
            3 (+ parameters). Ignored when ``config`` is given (it has its own).
        config: a DeepSpeed config dict or JSON file, used instead of the arguments above and below.
            ``"auto"`` values for the batch sizes, ``bf16``/``fp16`` and ``gradient_clipping`` are
            filled in (see :mod:`drivetrain.strategies.deepspeed_config`).
        offload_optimizer: keep optimizer state (and step) on the CPU or NVMe (stage 1-3).
        offload_parameters: keep parameters on the CPU or NVMe (stage 3 only).
        offload_device: ``"cpu"`` or ``"nvme"`` (then ``nvme_path`` is required).
        gradient_clipping: clip the gradient norm to this inside ``engine.step`` (DeepSpeed's own clipping).
        logging_level: level for DeepSpeed's logger (it is chatty at INFO).
        **options: the process-group settings of every parallel strategy (``num_nodes``, ``start_method``,
            ``timeout`` …): :class:`~drivetrain.strategies.process_group_options.ProcessGroupArguments`.

    Raises:
        drivetrain._utilities.imports.MissingDependencyError: ``deepspeed`` is not installed.
        ValueError/TypeError: arguments outside the documented values, or offload settings that
            contradict the stage.
    """

    kind = "deepspeed"
    owns_accumulation = True
    compiles_models = False  # the engine is not compiled from outside

    def __init__(
        self,
        accelerator: Accelerator | None = None,
        stage: int = 2,
        *,
        config: dict[str, Any] | str | Path | None = None,
        offload_optimizer: bool = False,
        offload_parameters: bool = False,
        offload_device: str = "cpu",
        nvme_path: str | None = None,
        gradient_clipping: float | None = None,
        logging_level: int = logging.WARNING,
        parallel_devices: list[torch.device] | None = None,
        cluster_environment: ClusterEnvironment | None = None,
        checkpoint_io: CheckpointIO | None = None,
        precision: Precision | None = None,
        precision_plugin: Precision | None = None,
        **options: Unpack[ProcessGroupArguments],
    ) -> None:
        require("deepspeed", extra="deepspeed", feature=_FEATURE)
        super().__init__(
            accelerator,
            parallel_devices,
            cluster_environment,
            checkpoint_io,
            precision,
            precision_plugin=precision_plugin,
            **options,
        )
        cfg.check_arguments(
            stage=stage,
            offload_optimizer=offload_optimizer,
            offload_parameters=offload_parameters,
            offload_device=offload_device,
            nvme_path=nvme_path,
        )
        if config is not None:
            changed = [
                name
                for name, value, default in (
                    ("stage", stage, 2),
                    ("offload_optimizer", offload_optimizer, False),
                    ("offload_parameters", offload_parameters, False),
                    ("gradient_clipping", gradient_clipping, None),
                )
                if value != default
            ]
            if changed:
                raise ValueError(
                    f"DeepSpeedStrategy got config= and also {', '.join(f'{name}=' for name in changed)}; with a config those settings "
                    f"come from it. Put them in the config (zero_optimization.stage, …) and drop the arguments."
                )
            self._config = cfg.load_user_config(config)
        else:
            self._config = cfg.config_from_arguments(
                stage=stage,
                offload_optimizer=offload_optimizer,
                offload_parameters=offload_parameters,
                offload_device=offload_device,
                nvme_path=nvme_path,
                gradient_clipping=gradient_clipping,
                pin_memory=False,
            )
        cfg.check_zero_settings(self._config)
        self.logging_level = logging_level
        self._micro_batch_size: int | None = None
        self._engine: Any = None
        self._engine_trains = False
        self._set_local_rank_variable = False

    @property
    def stage(self) -> int:
        """The ZeRO stage (from the arguments or the config)."""
        return cfg.zero_stage(self._config)

    @property
    def config(self) -> dict[str, Any]:
        """The DeepSpeed config as it stands (``"auto"`` values are filled at set-up)."""
        return self._config

    # -- connect()'s checks -----------------------------------------------------------------
    def connect_plugins(self, **plugins: Any) -> None:
        super().connect_plugins(**plugins)
        precision = self.precision
        if not isinstance(precision, DeepSpeedPrecision):
            if type(precision).__module__.startswith("drivetrain.") and precision.name:
                precision = DeepSpeedPrecision(precision.name)  # the engine does the casting and scaling
            else:
                raise ValueError(
                    f"DeepSpeedStrategy runs its own mixed precision and cannot use the custom precision plugin "
                    f"{precision!r}. Pass a precision name ('bf16-mixed', '16-mixed', '32-true') instead."
                )
        forced = cfg.fill_precision(self._config, precision.name)
        self._precision = precision if forced == precision.name else DeepSpeedPrecision(forced)
        if self.root_device.type == "cuda":
            for section in ("offload_optimizer", "offload_param"):
                target = self._config["zero_optimization"].get(section)
                if isinstance(target, dict):
                    target.setdefault("pin_memory", True)

    def check_accelerator(self, accelerator: Accelerator) -> None:
        """Refuse hardware DeepSpeed cannot run on here (XLA, MPS); warn where offload changes nothing."""
        kind = type(accelerator).__name__
        if kind in ("XLAAccelerator", "MPSAccelerator"):
            raise ValueError(
                f"DeepSpeedStrategy cannot run on {kind}. Use accelerator='cuda' (or 'cpu', slowly), or another "
                f"strategy ('xla' on XLA devices, 'auto' on MPS)."
            )
        zero = self._config.get("zero_optimization") or {}
        offloading = [s for s in ("offload_optimizer", "offload_param") if cfg._offloads(zero.get(s))]
        if kind == "CPUAccelerator" and any(zero[s].get("device") == "cpu" for s in offloading):
            warnings.warn(
                "DeepSpeed CPU offload on the CPU accelerator moves nothing (everything already lives in CPU "
                "memory); it only changes which code path DeepSpeed runs.",
                UserWarning,
                stacklevel=4,
            )

    # -- set-up -----------------------------------------------------------------------------
    @property
    def requires_joint_setup(self) -> bool:
        return True

    @property
    def forward_is_collective(self) -> bool:
        """Under ZeRO stage 3 each forward gathers the partitioned parameters."""
        return self.stage == 3

    def setup_environment(self) -> None:
        super().setup_environment()
        import deepspeed

        logging.getLogger("DeepSpeed").setLevel(self.logging_level)
        _match_deepspeed_accelerator(self.root_device)
        if "LOCAL_RANK" not in os.environ:
            # DeepSpeed reads LOCAL_RANK from the environment (engine set-up, ZeRO-3 partitioning)
            # for as long as it trains, as every launcher but ours sets it; drivetrain's re-run
            # launcher leaves it unset in rank 0, the process that started the others.
            os.environ["LOCAL_RANK"] = str(self.local_rank)
            self._set_local_rank_variable = True
        # The process group exists already (ParallelStrategy made it); DeepSpeed only wraps it.
        deepspeed.comm.init_distributed(
            dist_backend=self.process_group_backend,
            timeout=self.timeout,
            verbose=False,
            dist_init_required=False,
        )

    def process_dataloader(self, dataloader: Any) -> Any:
        """Remember the loader's batch size: it fills ``train_micro_batch_size_per_gpu: "auto"``."""
        size = getattr(dataloader, "batch_size", None) or getattr(
            getattr(dataloader, "batch_sampler", None), "batch_size", None
        )
        if isinstance(size, int) and self._micro_batch_size is None:
            self._micro_batch_size = size
        return dataloader

    def resolved_config(self) -> dict[str, Any]:
        """The config handed to DeepSpeed: ``"auto"`` values filled, drivetrain's defaults added."""
        import copy

        config = copy.deepcopy(self._config)
        cfg.fill_batch_sizes(config, micro_batch_size=self._micro_batch_size, world_size=self.world_size)
        cfg.fill_defaults(config)
        return config

    def module_init_context(self, empty_init: bool | None = None) -> AbstractContextManager[Any]:
        """Under ZeRO stage 3 with ``empty_init=True``, build the model already partitioned
        (``deepspeed.zero.Init``: no rank ever holds all of it); otherwise as usual."""
        if not (empty_init and self.stage == 3):
            return super().module_init_context(empty_init)
        import deepspeed

        return deepspeed.zero.Init(
            config_dict_or_path=self.resolved_config(), remote_device=_remote_device(self._config)
        )

    def module_to_device(self, module: nn.Module) -> None:
        """Nothing: the engine places the module itself (ZeRO-3 partitions, offload keeps them on the CPU)."""

    def setup_module_and_optimizers(
        self, module: nn.Module, optimizers: list[Optimizer]
    ) -> tuple[nn.Module, list[Optimizer]]:
        """Build the DeepSpeed engine around ``module`` and its (at most one) optimizer."""
        if len(optimizers) > 1:
            raise ValueError(
                f"DeepSpeed drives one optimizer per engine, got {len(optimizers)}. Combine the parameter groups "
                f"into one optimizer (torch.optim.X([{{'params': ...}}, {{'params': ...}}]))."
            )
        import deepspeed

        config = self.resolved_config()
        if not optimizers:
            # Evaluation: no optimizer to build or partition (ZeRO 1/2 partition only optimizer state and
            # gradients, and refuse to start without one); stage 3 still partitions the parameters.
            config.pop("optimizer", None)
            config.pop("scheduler", None)
            if self.stage < 3:
                config.pop("zero_optimization", None)
        engine, optimizer, _, _ = deepspeed.initialize(
            model=module,
            optimizer=optimizers[0] if optimizers else None,
            config=config,
            dist_init_required=False,
        )
        self._engine = engine
        self._engine_trains = bool(optimizers)
        self.model = engine
        if isinstance(self.precision, DeepSpeedPrecision):
            self.precision.engine = engine
        return engine, ([optimizer] if optimizers else [])

    def setup_module(self, module: nn.Module) -> nn.Module:
        """An engine without an optimizer (evaluation); train through :meth:`setup_module_and_optimizers`."""
        engine, _ = self.setup_module_and_optimizers(module, [])
        return engine

    def setup_optimizer(self, optimizer: Optimizer) -> Optimizer:
        raise ValueError(
            "DeepSpeed builds its engine from the model and the optimizer together; call "
            "setup_module_and_optimizers(model, [optimizer]) instead of setup_module/setup_optimizer."
        )

    @property
    def engine_trains(self) -> bool:
        """Whether the engine set up last has an optimizer (built for training, not for evaluation)."""
        return self._engine is not None and self._engine_trains

    def engine_of(self, module: nn.Module | None) -> Any:
        """The DeepSpeed engine for ``module`` (the one set up last when ``None``)."""
        from deepspeed import DeepSpeedEngine

        if isinstance(module, DeepSpeedEngine):
            return module
        if self._engine is None:
            raise RuntimeError(
                "No DeepSpeed engine yet: call setup_module_and_optimizers(model, [optimizer]) first."
            )
        return self._engine

    # -- the per-step path ---------------------------------------------------------------------
    def backward(self, tensor: Tensor, module: nn.Module | None = None, *args: Any, **kwargs: Any) -> None:
        """``engine.backward(loss)``: DeepSpeed scales fp16 losses and reduces gradients itself."""
        self.engine_of(module).backward(tensor, *args, **kwargs)

    def optimizer_step(
        self,
        optimizer: Optimizer,
        closure: Callable[[], Any] | None = None,
        model: nn.Module | None = None,
        **kwargs: Any,
    ) -> Any:
        """``engine.step()`` (after running ``closure``, whose result is returned)."""
        result = closure() if closure is not None else None
        self.engine_of(model).step(**kwargs)
        return result

    def no_backward_sync(self, module: nn.Module, enabled: bool = True) -> AbstractContextManager[Any]:
        """Stage 0/1: the engine's ``no_sync()``. Stage 2/3 cannot skip the reduction (they partition
        gradients as they are produced): that is an error pointing at DeepSpeed's own accumulation."""
        if not enabled:
            return nullcontext()
        if self.stage >= 2:
            raise ValueError(
                f"ZeRO stage {self.stage} reduces and partitions gradients during every backward, so it cannot skip "
                f"gradient synchronisation. Accumulate the DeepSpeed way: set gradient_accumulation_steps in the "
                f"DeepSpeed config and call backward and optimizer_step on every micro-batch (the engine only "
                f"updates on the accumulation boundary), or use stage 0/1."
            )
        return self.engine_of(module).no_sync()

    def clip_gradients_norm(
        self,
        module: nn.Module,
        optimizer: Optimizer,
        max_norm: float,
        norm_type: float = 2.0,
        error_if_nonfinite: bool | None = None,
    ) -> Tensor:
        """DeepSpeed clips inside ``engine.step`` by its config's ``gradient_clipping``.

        This accepts the call when the config already clips to ``max_norm`` (2-norm) and returns
        the norm the engine measured at its previous step (NaN before the first). Anything else
        is an error that says where to set it.
        """
        configured = self._config.get("gradient_clipping")
        if norm_type != 2.0 or configured is None or float(configured) != float(max_norm):
            raise ValueError(
                f"DeepSpeed clips gradients inside its step, by the 2-norm in its config's gradient_clipping "
                f"(now {configured!r}); clip_gradients_norm(max_norm={max_norm}, norm_type={norm_type}) cannot run "
                f'outside it. Pass DeepSpeedStrategy(gradient_clipping={max_norm}) or set "gradient_clipping": '
                f"{max_norm} in the config."
            )
        norm = self.engine_of(module).get_global_grad_norm()
        return torch.tensor(float("nan") if norm is None else float(norm))

    def clip_gradients_value(self, module: nn.Module, optimizer: Optimizer, clip_val: float) -> None:
        raise ValueError(
            f"DeepSpeed cannot clip gradients by value (clip_val={clip_val}); it clips the 2-norm inside its step. "
            f"Use gradient_clipping=<max norm> on the strategy (or in the config) instead."
        )

    # -- state ---------------------------------------------------------------------------------
    def unwrap_module(self, module: nn.Module) -> nn.Module:
        inner = getattr(module, "module", None)
        if type(module).__name__ == "DeepSpeedEngine" and isinstance(inner, nn.Module):
            return super().unwrap_module(inner)
        return super().unwrap_module(module)

    def get_module_state_dict(self, module: nn.Module) -> dict[str, Any]:
        """The full state dict. Under stage 3 parameters are gathered (every rank must call) and
        the dict is returned on rank 0 only (``{}`` elsewhere)."""
        inner = self.unwrap_module(module)
        if self.stage < 3:
            return inner.state_dict()
        import deepspeed

        with deepspeed.zero.GatheredParameters(list(inner.parameters()), modifier_rank=None):
            if not self.is_global_zero:
                return {}
            return {name: tensor.detach().cpu().clone() for name, tensor in inner.state_dict().items()}

    def load_module_state_dict(
        self, module: nn.Module, state_dict: dict[str, Any], strict: bool = True
    ) -> None:
        """Load a full state dict (rank 0's counts under stage 3; every rank must call)."""
        inner = self.unwrap_module(module)
        if self.stage < 3:
            inner.load_state_dict(state_dict, strict=strict)
            return
        import deepspeed

        with deepspeed.zero.GatheredParameters(list(inner.parameters()), modifier_rank=0):
            if self.is_global_zero:
                inner.load_state_dict(state_dict, strict=strict)

    def save_state(self, path: str | Path, state: dict[str, Any], storage_options: Any | None = None) -> None:
        """Save through ``engine.save_checkpoint`` into directory ``path`` (each rank writes its
        partitions); the other entries of ``state`` ride along as DeepSpeed client state."""
        if storage_options is not None:
            raise TypeError("DeepSpeedStrategy.save_state does not take storage_options.")
        _refuse_remote(path)
        from drivetrain.strategies.deepspeed_checkpoint import save_engine_state

        save_engine_state(self, path, state)

    def load_state(
        self,
        path: str | Path,
        state: dict[str, Any] | None = None,
        strict: bool = True,
        *,
        weights_only: bool = True,
        map_location: Any | None = None,
    ) -> dict[str, Any]:
        """Restore the engine (and its optimizer, when named in ``state``) and the other entries.

        Every file is read with ``weights_only=True`` (DeepSpeed's own checkpoint classes
        allowed) unless ``weights_only=False``. DeepSpeed reads its files into the engine's
        partitions where they live, so ``map_location`` changes nothing here.
        """
        _refuse_remote(path)
        from drivetrain.strategies.deepspeed_checkpoint import load_engine_state

        return load_engine_state(self, path, state if state is not None else {}, strict, weights_only)

    def teardown(self) -> None:
        if self._set_local_rank_variable:
            os.environ.pop("LOCAL_RANK", None)
            self._set_local_rank_variable = False
        self._engine = None
        super().teardown()

    @classmethod
    def register_strategies(cls, strategy_registry: Any) -> None:
        presets: list[tuple[str, str, dict[str, Any]]] = [
            ("deepspeed", "DeepSpeed ZeRO stage 2 (optimizer state and gradients partitioned).", {}),
            ("deepspeed_stage_1", "DeepSpeed ZeRO stage 1: optimizer state partitioned.", {"stage": 1}),
            (
                "deepspeed_stage_2",
                "DeepSpeed ZeRO stage 2: optimizer state and gradients partitioned.",
                {"stage": 2},
            ),
            (
                "deepspeed_stage_2_offload",
                "DeepSpeed ZeRO stage 2 with optimizer state offloaded to CPU memory.",
                {"stage": 2, "offload_optimizer": True},
            ),
            ("deepspeed_stage_3", "DeepSpeed ZeRO stage 3: parameters partitioned too.", {"stage": 3}),
            (
                "deepspeed_stage_3_offload",
                "DeepSpeed ZeRO stage 3 with parameters and optimizer state offloaded to CPU memory.",
                {"stage": 3, "offload_optimizer": True, "offload_parameters": True},
            ),
        ]
        for name, description, kwargs in presets:
            strategy_registry.register(name, cls, description=description, **kwargs)

    def __repr__(self) -> str:
        return f"DeepSpeedStrategy(stage={self.stage}, precision={self._precision!r})"


def _remote_device(config: dict[str, Any]) -> str | None:
    target = (config.get("zero_optimization") or {}).get("offload_param")
    return (
        target.get("device")
        if isinstance(target, dict) and target.get("device") not in (None, "none")
        else None
    )


def _match_deepspeed_accelerator(device: torch.device) -> None:
    """Make DeepSpeed's own accelerator agree with ours (it guesses from the machine otherwise)."""
    from deepspeed.accelerator import get_accelerator, set_accelerator

    if device.type == "cpu" and get_accelerator().device_name() != "cpu":
        from deepspeed.accelerator.cpu_accelerator import CPU_Accelerator

        set_accelerator(CPU_Accelerator())


def _refuse_remote(path: str | Path) -> None:
    """DeepSpeed's engine writes and reads its folders with local file calls: a URL would become a local folder."""

    if paths.is_remote(path):
        raise ValueError(
            f"'{os.fspath(path)}' is remote storage, but DeepSpeed's engine writes and reads checkpoint folders on a "
            f"local (or mounted) file system only. Save to a local path and copy the folder, or use "
            f"strategy='fsdp', whose sharded checkpoints go to remote storage directly."
        )
