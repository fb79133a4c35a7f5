"""``Trainer``: runs a :class:`TrainingModule` through fit, validate, test and predict on any strategy.

The Trainer resolves its hardware settings with :func:`drivetrain.connect` when it is built
and talks to devices and processes only through the Strategy that returns. Each entry point
starts the strategy's processes (``strategy.launcher.launch``) and runs :meth:`Trainer._run_stage`
in every one of them; the loops, hooks, logging, data and checkpointing live in their own
modules of this package.
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import os
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from drivetrain._utilities import paths
from drivetrain._utilities.retired import refuse_retired_arguments
from drivetrain.trainer.datamodule import DataModule
from drivetrain.trainer.module import TrainingModule
from drivetrain.trainer.properties import TrainerProperties
from drivetrain.trainer.retired_arguments import RETIRED_TRAINER_ARGUMENTS
from drivetrain.trainer.run_state import RunState
from drivetrain.trainer.state import (
    FitProgress,
    FitProgressView,
    TrainerFn,
    TrainerState,
    TrainerStatus,
)

# The core, the loops, hooks, callbacks and loggers are imported where a Trainer is built or run,
# so that ``from drivetrain import Trainer`` costs little more than ``import torch``.
if TYPE_CHECKING:
    from drivetrain.accelerators.accelerator import Accelerator
    from drivetrain.connector import PluginInput
    from drivetrain.loggers.logger import Logger
    from drivetrain.plugins.precision.precision import Precision
    from drivetrain.profilers import Profiler
    from drivetrain.strategies.strategy import Strategy
    from drivetrain.trainer.callbacks.callback import Callback


class Trainer(TrainerProperties):
    """Train, validate, test and predict with a :class:`TrainingModule` on any hardware and strategy.

    Args:
        accelerator: ``"auto"``, a registered name (``"cpu"``, ``"cuda"``, ``"gpu"``, a user's ``"xpu"``)
            or an :class:`~drivetrain.accelerators.Accelerator` instance.
        strategy: ``"auto"``, a registered name (``"ddp"``, ``"ddp_spawn"``, ``"fsdp"`` …) or a Strategy.
        devices: ``"auto"``, a count, ``-1`` for all, or device indices.
        num_nodes: how many nodes the job spans.
        precision: ``"32-true"`` (default), ``"bf16-mixed"``, ``"16-mixed"``, ``"64-true"`` … or a Precision.
        plugins: Precision, CheckpointIO and ClusterEnvironment instances.
        max_epochs: stop after this many epochs (default 1000 when no other limit is set; -1: no limit).
        min_epochs: train at least this many epochs even when asked to stop.
        min_steps: make at least this many optimizer steps even when asked to stop (early stopping).
        max_steps: stop after this many optimizer steps (-1: no limit).
        max_time: stop after this long (``"DD:HH:MM:SS"``, a ``timedelta`` or a dict).
        limit_train_batches: batches per training epoch (an int) or fraction of the loader (a float; default 1.0).
        limit_val_batches: the same for validation (0 disables validation).
        limit_test_batches: the same for test.
        limit_predict_batches: the same for predict.
        val_check_interval: validate every this fraction of an epoch (float; default 1.0) or number of batches (int),
            or once this much wall time passed since the last validation (``"DD:HH:MM:SS"``, a
            ``timedelta`` or a dict of its arguments; checked after each batch).
        check_val_every_n_epoch: validate in every n-th epoch (``None``: count ``val_check_interval``
            batches across epochs).
        num_sanity_val_steps: validation batches run before training, to catch bugs early (default 2; -1: all).
        accumulate_grad_batches: step the optimizer every this many batches (default:
            ``drivetrain launch --gradient_accumulation_steps``, else 1).
        gradient_clip_val: clip gradients to this total norm (or value); ``None`` for no clipping.
        gradient_clip_algorithm: ``"norm"`` (default) or ``"value"``.
        callbacks: a :class:`Callback` or a list of them.
        logger: ``True``/``None`` (the default logger: TensorBoard when installed, else CSV, under
            ``default_root_dir/drivetrain_logs``), ``False``, a logger name (``"csv"``, ``"tensorboard"``,
            ``"wandb"``, ``"mlflow"``, ``"all"`` or a registered one), a Logger, or a list of names and loggers.
        log_every_n_steps: send step metrics to the loggers every this many batches (default 50).
        enable_progress_bar: show a progress bar (tqdm) on global rank 0 (default ``True``).
        enable_checkpointing: add a ``ModelCheckpoint`` (last epoch) unless one is given (default ``True``).
        enable_model_summary: print the module's layers and parameter counts at fit start (default ``True``).
        default_root_dir: where logs and checkpoints go by default (the working directory).
        deterministic: ``torch.use_deterministic_algorithms`` for the run (``"warn"``: warn only).
        benchmark: ``torch.backends.cudnn.benchmark`` for the run.
        fast_dev_run: run n batches (``True``: 1) of every stage, as a smoke test: the loggers are
            replaced by a ``DummyLogger`` that records nothing, and no checkpoint is written but the
            ``last.ckpt`` of a ``ModelCheckpoint(save_last=True)`` (as in Lightning).
        use_distributed_sampler: share each loader's batches between the processes (training:
            equal shares, so they step together; evaluation and prediction: no batch twice).
            ``False`` leaves it to the loaders, as does a ``DistributedSampler`` in one.
        detect_anomaly: train under ``torch.autograd.set_detect_anomaly`` (an error names the operation
            whose backward produced NaN; slow, for debugging).
        inference_mode: run ``validate``/``test``/``predict`` under ``torch.inference_mode`` where the strategy
            allows it (not FSDP), else ``torch.no_grad``. Validation inside ``fit`` always uses ``no_grad``.
        overfit_batches: train on the same first n batches (an int) or fraction of the training data in
            every epoch, in order (shuffling is turned off), and validate on as many validation batches.
        profiler: ``"simple"``, ``"advanced"``, ``"pytorch"`` or a :class:`~drivetrain.profilers.Profiler`: time
            hooks, steps and data fetches; the report is logged (or written) when each entry point ends.
        sync_batchnorm: turn BatchNorm layers into synchronised ones, whose batch statistics span every
            process, when several processes train (DDP, FSDP).
        reload_dataloaders_every_n_epochs: call the ``train_dataloader``/``val_dataloader`` hooks again
            every n epochs (0: once per fit).
        barebones: turn off everything that costs time beyond the loop itself (checkpointing, logging and
            ``self.log``, progress bar, model summary, sanity check); asking for one of them too is an error.

    Example:
        >>> trainer = Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=3)  # doctest: +SKIP
        >>> trainer.fit(model, datamodule=data)  # doctest: +SKIP
    """

    @refuse_retired_arguments(RETIRED_TRAINER_ARGUMENTS)
    def __init__(
        self,
        *,
        accelerator: str | Accelerator = "auto",
        strategy: str | Strategy = "auto",
        devices: int | str | Sequence[int] = "auto",
        num_nodes: int = 1,
        precision: str | int | Precision | None = None,
        plugins: PluginInput | Sequence[PluginInput] | None = None,
        max_epochs: int | None = None,
        min_epochs: int | None = None,
        max_steps: int = -1,
        min_steps: int | None = None,
        max_time: Any = None,
        limit_train_batches: int | float | None = None,
        limit_val_batches: int | float | None = None,
        limit_test_batches: int | float | None = None,
        limit_predict_batches: int | float | None = None,
        val_check_interval: int | float | str | datetime.timedelta | dict[str, int] | None = None,
        check_val_every_n_epoch: int | None = 1,
        num_sanity_val_steps: int | None = None,
        accumulate_grad_batches: int | None = None,
        gradient_clip_val: float | None = None,
        gradient_clip_algorithm: str | None = None,
        callbacks: Callback | list[Callback] | None = None,
        logger: bool | str | Logger | Sequence[str | Logger] | None = None,
        log_every_n_steps: int | None = None,
        enable_progress_bar: bool | None = None,
        enable_checkpointing: bool | None = None,
        enable_model_summary: bool | None = None,
        default_root_dir: str | Path | None = None,
        deterministic: bool | str | None = None,
        benchmark: bool | None = None,
        fast_dev_run: bool | int = False,
        use_distributed_sampler: bool = True,
        inference_mode: bool = True,
        detect_anomaly: bool = False,
        overfit_batches: int | float = 0.0,
        profiler: str | Profiler | None = None,
        sync_batchnorm: bool = False,
        reload_dataloaders_every_n_epochs: int = 0,
        barebones: bool = False,
    ) -> None:
        from drivetrain.connector import connect
        from drivetrain.loggers.logger import DummyLogger
        from drivetrain.trainer import info_lines
        from drivetrain.trainer.arguments import apply_barebones, resolve_features
        from drivetrain.trainer.config import build_settings
        from drivetrain.trainer.data_connector import DataConnector
        from drivetrain.trainer.default_callbacks import configure_callbacks
        from drivetrain.trainer.logger_connector import MetricsHub, resolve_loggers
        from drivetrain.trainer.loops.optimization import Optimization

        given = apply_barebones(
            barebones,
            {
                "logger": logger,
                "enable_checkpointing": enable_checkpointing,
                "enable_progress_bar": enable_progress_bar,
                "enable_model_summary": enable_model_summary,
                "log_every_n_steps": log_every_n_steps,
                "num_sanity_val_steps": num_sanity_val_steps,
                "fast_dev_run": fast_dev_run,
                "detect_anomaly": detect_anomaly,
                "profiler": profiler,
            },
        )
        features = resolve_features(
            barebones=barebones,
            overfit_batches=overfit_batches,
            sync_batchnorm=sync_batchnorm,
            reload_dataloaders_every_n_epochs=reload_dataloaders_every_n_epochs,
            profiler=profiler,
            limit_train_batches=limit_train_batches,
            limit_val_batches=limit_val_batches,
            deterministic=deterministic,
            benchmark=benchmark,
            use_distributed_sampler=use_distributed_sampler,
            detect_anomaly=detect_anomaly,
        )
        if features.overfit_batches:
            limit_train_batches = limit_val_batches = features.overfit_batches
        self._strategy = connect(
            accelerator=accelerator,
            strategy=strategy,
            devices=devices,
            num_nodes=num_nodes,
            precision=precision,
            plugins=plugins,
        )
        # strategy="auto" on several processes weighs DDP against FSDP once the model is known (by fit, when
        # it is the first entry point: afterwards this strategy's processes exist).
        self._size_auto_strategy = isinstance(strategy, str) and strategy == "auto"
        settings = build_settings(
            max_epochs=max_epochs,
            min_epochs=min_epochs,
            max_steps=max_steps,
            min_steps=min_steps,
            max_time=max_time,
            limit_train_batches=limit_train_batches,
            limit_val_batches=limit_val_batches,
            limit_test_batches=limit_test_batches,
            limit_predict_batches=limit_predict_batches,
            val_check_interval=val_check_interval,
            check_val_every_n_epoch=check_val_every_n_epoch,
            num_sanity_val_steps=given["num_sanity_val_steps"],
            accumulate_grad_batches=accumulate_grad_batches,
            gradient_clip_val=gradient_clip_val,
            gradient_clip_algorithm=gradient_clip_algorithm,
            log_every_n_steps=given["log_every_n_steps"],
            fast_dev_run=fast_dev_run,
            inference_mode=inference_mode,
        )
        self._default_root_dir = (
            paths.normalize(default_root_dir, "default_root_dir")
            if default_root_dir is not None
            else os.getcwd()
        )
        paths.check(self._default_root_dir)  # s3://... without s3fs, or an unknown scheme: reported here
        fast = settings.fast_dev_run > 0
        loggers = resolve_loggers(
            given["logger"], self._default_root_dir
        )  # checked even when fast_dev_run drops them
        # Everything a run changes, shared with the loops, checkpointing and the tuner (see run_state.py).
        self._run = run = RunState(
            settings=settings,
            features=features,
            state=TrainerState(),
            progress=FitProgress(),
            # fast_dev_run: a DummyLogger stands in for the loggers (Lightning's), so module code using them runs.
            metrics=MetricsHub(
                ([DummyLogger()] if loggers else []) if fast else loggers,
                epoch=functools.partial(_current_epoch, self),
            ),
            callbacks=configure_callbacks(
                callbacks,
                enable_progress_bar=given["enable_progress_bar"],
                enable_checkpointing=given["enable_checkpointing"],
                enable_model_summary=given["enable_model_summary"],
                fast_dev_run=fast,
                barebones=barebones,
            ),
        )
        run.data = DataConnector(self, run)
        run.optimization = Optimization(self, run)
        self._fit_progress = FitProgressView(run)
        info_lines.at_init(
            {
                "limit_train_batches": limit_train_batches,
                "limit_val_batches": limit_val_batches,
                "limit_test_batches": limit_test_batches,
                "limit_predict_batches": limit_predict_batches,
                "val_check_interval": val_check_interval,
            },
            settings,
            self._strategy,
            barebones,
            detect_anomaly,
        )

    # -- entry points -----------------------------------------------------------------------
    def fit(
        self,
        model: TrainingModule,
        train_dataloaders: Any = None,
        val_dataloaders: Any = None,
        datamodule: DataModule | None = None,
        ckpt_path: str | Path | None = None,
        weights_only: bool | None = None,
    ) -> None:
        """Train ``model``, validating as configured.

        Args:
            model: the module to train (updated in place, also under ``ddp_spawn``).
            train_dataloaders: a loader (or any iterable of batches); or a DataModule.
            val_dataloaders: a loader or a list of loaders.
            datamodule: provides the loaders instead.
            ckpt_path: resume from this checkpoint, or ``"last"`` for the newest ``last.ckpt``
                of the checkpoint callbacks (a warning, and a fresh start, when there is none), or
                ``"hpc"`` for the newest preemption checkpoint. Unset: resume from the newest
                preemption checkpoint (``default_root_dir/hpc_ckpt_<N>.ckpt``, saved when a
                ``SIGTERM`` or a cluster's requeue signal stopped a fit) if there is one, else start
                fresh. Such a stop exits the program with code ``128 + signal``
                (:class:`~drivetrain.strategies.preemption.Preempted`).
            weights_only: read the checkpoint safely (``None``/``True``: tensors, plain values and
                allow-listed classes only). ``False`` unpickles anything, which can run code from
                the file: only for checkpoints from a trusted source.
        """
        if isinstance(train_dataloaders, DataModule):
            datamodule, train_dataloaders = train_dataloaders, None
        self._begin(
            TrainerFn.FITTING,
            model,
            datamodule,
            ckpt_path,
            weights_only,
            train=train_dataloaders,
            val=val_dataloaders,
        )
        if self._size_auto_strategy:
            from drivetrain.connector import fit_auto_strategy

            self._strategy, _ = fit_auto_strategy(self._strategy, self._run.module)
        self._launch()

    def validate(
        self,
        model: TrainingModule | None = None,
        dataloaders: Any = None,
        ckpt_path: str | Path | None = None,
        verbose: bool = True,
        datamodule: DataModule | None = None,
        weights_only: bool | None = None,
    ) -> list[dict[str, float]]:
        """Run validation once; returns one dict of epoch metrics per loader (reduced across processes)."""
        return self._evaluate(
            TrainerFn.VALIDATING, model, dataloaders, ckpt_path, verbose, datamodule, "val", weights_only
        )

    def test(
        self,
        model: TrainingModule | None = None,
        dataloaders: Any = None,
        ckpt_path: str | Path | None = None,
        verbose: bool = True,
        datamodule: DataModule | None = None,
        weights_only: bool | None = None,
    ) -> list[dict[str, float]]:
        """Run the test loop; returns one dict of epoch metrics per loader (reduced across processes)."""
        return self._evaluate(
            TrainerFn.TESTING, model, dataloaders, ckpt_path, verbose, datamodule, "test", weights_only
        )

    def predict(
        self,
        model: TrainingModule | None = None,
        dataloaders: Any = None,
        datamodule: DataModule | None = None,
        return_predictions: bool = True,
        ckpt_path: str | Path | None = None,
        weights_only: bool | None = None,
    ) -> Any:
        """Run ``predict_step`` over the data; returns the outputs of all processes, in dataset order.

        One list of batch outputs (a list of such lists for several loaders). In a multi-process
        run every process returns the complete list.
        """
        if isinstance(dataloaders, DataModule):
            datamodule, dataloaders = dataloaders, None
        self._run.return_predictions = return_predictions
        self._begin(TrainerFn.PREDICTING, model, datamodule, ckpt_path, weights_only, predict=dataloaders)
        return self._launch()

    def _evaluate(
        self,
        fn: TrainerFn,
        model: TrainingModule | None,
        dataloaders: Any,
        ckpt_path: str | Path | None,
        verbose: bool,
        datamodule: DataModule | None,
        prefix: str,
        weights_only: bool | None,
    ) -> list[dict[str, float]]:
        if isinstance(dataloaders, DataModule):
            datamodule, dataloaders = dataloaders, None
        self._begin(fn, model, datamodule, ckpt_path, weights_only, **{prefix: dataloaders})
        results = self._launch()
        if verbose and self.is_global_zero:
            from drivetrain.trainer.summary_table import print_results

            print_results(fn.value, results)
        return results

    def _begin(
        self,
        fn: TrainerFn,
        model: TrainingModule | None,
        datamodule: DataModule | None,
        ckpt_path: str | Path | None,
        weights_only: bool | None,
        **loaders: Any,
    ) -> None:
        from drivetrain.trainer.entry_points import check_ckpt_request, check_model, warn_current_weights

        run = self._run
        run.module, run.compiler = check_model(self, run, fn, model)
        run.data.attach(datamodule, **loaders)
        if ckpt_path is None:
            ckpt_path = run.ckpt_path_set
        else:
            run.ckpt_path_set = None  # an explicit argument replaces what was set
        if model is None and ckpt_path is None and fn != TrainerFn.FITTING:
            warn_current_weights(self, fn)
        if ckpt_path is not None:
            # A save_checkpoint() since the last entry point may still be writing (AsyncCheckpointIO): every
            # process finishes its checkpoint IO's pending work before any looks for the file (rank 0 writes it).
            self._strategy.checkpoint_io.teardown()
            self._strategy.barrier("ckpt_path")
        run.ckpt_request = check_ckpt_request(fn, ckpt_path, weights_only)
        run.ckpt_weights_only = weights_only is not False
        run.state = TrainerState(fn=fn, status=TrainerStatus.RUNNING)
        if fn == TrainerFn.FITTING:
            run.new_fit()

    # -- running in every process ---------------------------------------------------------------
    def _launch(self) -> Any:
        run = self._run
        run.ran_here = False
        # Processes are started from here on: "auto" is sized only by a fit that comes first.
        self._size_auto_strategy = False
        launcher = self.strategy.launcher
        if self.strategy.is_global_zero:
            for logger in self.loggers:
                _ = logger.version  # fixed here, so ranks in new processes write where this process looks
        try:
            output = launcher.launch(self._run_stage) if launcher is not None else self._run_stage()
        except BaseException:
            run.state.status = TrainerStatus.INTERRUPTED
            raise
        if not run.ran_here:
            from drivetrain.trainer.process_results import absorb_output

            absorb_output(self, run, output)  # the ranks ran in other processes (spawn/fork)
        run.state.status = TrainerStatus.FINISHED
        run.state.stage = None
        return output["results"] if output is not None else None

    def _run_stage(self) -> dict[str, Any]:
        """Everything one process does for the current entry point; returns what the caller gets."""
        from drivetrain.strategies.preemption import Preempted
        from drivetrain.trainer import checkpointing
        from drivetrain.trainer.default_callbacks import module_callbacks
        from drivetrain.trainer.entry_points import run_entry_point
        from drivetrain.trainer.hooks import hook_runner
        from drivetrain.trainer.model_setup import setup_model
        from drivetrain.trainer.process_results import stage_output
        from drivetrain.trainer.results import new_results
        from drivetrain.trainer.run_context import compiled_forward, profiling, release_strategy, torch_flags

        run = self._run
        run.ran_here = True
        strategy = self.strategy
        fn = run.state.fn
        assert fn is not None and run.module is not None
        module = run.module
        strategy.setup_environment()
        strategy.setup(self)
        run.strategy_ready = True
        run.metrics.is_global_zero = strategy.is_global_zero
        module.__dict__["_trainer"] = self
        datamodule = run.data.datamodule
        if datamodule is not None:
            datamodule.trainer = self
        run.callbacks = module_callbacks(run.callbacks, module)
        hooks: Any = hook_runner(self, run)
        run.hooks = hooks
        run.restored = False
        run.pending_process = None
        stage = fn.value
        fitting = fn == TrainerFn.FITTING
        features = run.features
        status = "success"
        try:
            with (
                torch_flags(features.deterministic, features.benchmark, strategy.root_device),
                profiling(self, features.profiler, stage),
                compiled_forward(module, run.compiler),
            ):
                run.data.prepare_data(stage)
                hooks.call("setup", stage)
                run.ckpt_path = checkpointing.resolve_ckpt_path(self, fn, run.ckpt_request)
                run.model, run.optimizers, run.scheduler_configs = setup_model(
                    self, run, with_optimizers=fitting, restoring=run.ckpt_path is not None
                )
                if fitting:
                    run.train_results = run.metrics.train = new_results(features, strategy, True)
                run.data.setup(fn)
                results = run_entry_point(self, run, fn)
            return stage_output(self, run, fn, results)
        except BaseException as error:
            strategy.on_exception(error)  # first: the hooks below must not wait for peers in a collective
            status = "aborted" if isinstance(error, (KeyboardInterrupt, Preempted)) else "failed"
            run.state.status = TrainerStatus.INTERRUPTED
            if hooks.on_exception is not None:
                hooks.on_exception(error)
            raise
        finally:
            try:
                hooks.call("teardown", stage)
                if datamodule is not None:
                    datamodule.teardown(stage)
                run.metrics.finalize(status)
            finally:
                module._results = None
                run.loaded_checkpoint = None  # a run that failed before restoring holds no checkpoint
                run.strategy_ready = False
                release_strategy(strategy)

    # -- checkpoints ------------------------------------------------------------------------------
    def save_checkpoint(
        self, filepath: str | Path, weights_only: bool = False, storage_options: Any | None = None
    ) -> None:
        """Save the state to ``filepath`` through the strategy; call it on every process.

        Works while an entry point runs (from a callback or a module hook) and after one returns:
        after ``fit`` the training state (weights, optimizers, schedulers, progress, callbacks,
        generators); after ``validate``/``test``/``predict`` what that entry point set up (the
        weights, without optimizers).

        Args:
            filepath: a local path or a remote URL (``s3://bucket/run/step.ckpt``).
            weights_only: only the module's weights (such a file cannot resume a fit).
            storage_options: for a remote ``filepath``, the fsspec filesystem's options (endpoint,
                credentials ...), passed to the strategy's CheckpointIO.

        Raises:
            RuntimeError: no entry point has run yet; or, under ``ddp_spawn``, a full save in the
                launching process, which holds the trained weights but not the spawned processes'
                optimizer and generator states.
        """
        from drivetrain.trainer import checkpointing
        from drivetrain.trainer.entry_points import check_can_save

        check_can_save(self, self._run, weights_only)
        checkpointing.save_checkpoint(self, self._run, filepath, weights_only, storage_options)

    # -- helpers for callbacks and modules ----------------------------------------------------------
    def log_metrics(self, metrics: Mapping[str, Any], step: int | None = None) -> None:
        """Send ``metrics`` to every logger now, as the Trainer sends logged values.

        Global rank 0 writes (other processes do nothing); each row gets the current ``epoch``, and the
        values show in :attr:`logged_metrics`. Built-in callbacks (``LearningRateMonitor``,
        ``ThroughputMonitor``) log this way; values logged with ``self.log`` in the module are reduced
        and sent by the Trainer instead.

        Args:
            metrics: names and numbers (or one-element tensors).
            step: the x-axis value (default: :attr:`global_step`).
        """
        self._run.metrics.log(metrics, step=self.global_step if step is None else step)

    def print(self, *args: Any, **kwargs: Any) -> None:
        """``print`` (same arguments) on global rank 0 only, above any progress bar."""
        if self.is_global_zero:
            from drivetrain._utilities import console

            console.print_line(*args, **kwargs)

    @contextlib.contextmanager
    def init_module(self, empty_init: bool | None = None) -> Iterator[None]:
        """Build the model inside this context to create it on the strategy's device, in its precision.

        Args:
            empty_init: skip initialising weights that a checkpoint or a sharded strategy will set
                anyway (with FSDP: build on the meta device).

        Example:
            >>> with trainer.init_module():  # doctest: +SKIP
            ...     model = MyModule()
        """
        with self.strategy.module_init_context(empty_init):
            yield

    def __repr__(self) -> str:
        return f"Trainer(strategy={self._strategy!r}, fn={self.state.fn.value if self.state.fn else None})"


def _current_epoch(trainer: Trainer) -> int:
    return trainer.current_epoch
