"""Accelerate's configuration objects and enums, with the same names, fields and defaults."""

from __future__ import annotations

import dataclasses
import os
from enum import Enum

from drivetrain._utilities import paths


class DistributedType(str, Enum):
    """How the processes of a run are organised (``Accelerator.distributed_type``).

    Every member of Accelerate's enum is here, so programs that compare against one run
    unchanged; drivetrain reports only those of hardware and strategies it has (NO, MULTI_CPU,
    MULTI_GPU, MULTI_XPU, MULTI_MPS, DEEPSPEED, FSDP, XLA).
    """

    NO = "NO"
    MULTI_CPU = "MULTI_CPU"
    MULTI_GPU = "MULTI_GPU"
    MULTI_XPU = "MULTI_XPU"
    MULTI_MPS = "MULTI_MPS"
    DEEPSPEED = "DEEPSPEED"
    FSDP = "FSDP"
    XLA = "XLA"
    # Accelerate's members for hardware and integrations drivetrain does not have: never reported.
    MULTI_NPU = "MULTI_NPU"
    MULTI_MLU = "MULTI_MLU"
    MULTI_SDAA = "MULTI_SDAA"
    MULTI_MUSA = "MULTI_MUSA"
    MULTI_HPU = "MULTI_HPU"
    MULTI_NEURON = "MULTI_NEURON"
    MEGATRON_LM = "MEGATRON_LM"


class PrecisionType(str, Enum):
    """The ``mixed_precision`` values Accelerate accepts (drivetrain also takes its own names)."""

    NO = "no"
    FP16 = "fp16"
    BF16 = "bf16"


class RNGType(str, Enum):
    """Generators a prepared loader can synchronise across processes at each epoch start."""

    TORCH = "torch"
    CUDA = "cuda"
    XPU = "xpu"
    MPS = "mps"
    XLA = "xla"
    GENERATOR = "generator"


class LoggerType(str, Enum):
    """Experiment trackers ``log_with`` accepts (any registered logger name works too)."""

    ALL = "all"
    TENSORBOARD = "tensorboard"
    CSV = "csv"
    WANDB = "wandb"
    MLFLOW = "mlflow"


@dataclasses.dataclass
class ProjectConfiguration:
    """Where a run writes: logs, and checkpoints saved with ``save_state``.

    Args:
        project_dir: the run's directory.
        logging_dir: where trackers write (defaults to ``project_dir``).
        automatic_checkpoint_naming: ``save_state()`` without a directory writes
            ``project_dir/checkpoints/checkpoint_<iteration>``.
        total_limit: with automatic naming, keep at most this many checkpoints (oldest removed).
        iteration: the number the next automatic checkpoint gets.
        save_on_each_node: ``save`` writes on every node's local main process, not only rank 0.
    """

    project_dir: str | None = None
    logging_dir: str | None = None
    automatic_checkpoint_naming: bool = False
    total_limit: int | None = None
    iteration: int = 0
    save_on_each_node: bool = False

    def set_directories(self, project_dir: str | os.PathLike[str] | None = None) -> None:
        """Set ``project_dir``, and ``logging_dir`` too unless it was given."""
        self.project_dir = paths.normalize(project_dir, "project_dir") if project_dir is not None else None
        paths.check(self.project_dir)  # s3://... without s3fs, or an unknown scheme: reported here
        if self.logging_dir is None:
            self.logging_dir = self.project_dir

    def __post_init__(self) -> None:
        if self.project_dir is not None:
            self.project_dir = paths.normalize(self.project_dir, "project_dir")
            paths.check(self.project_dir)
        if self.logging_dir is not None:
            self.logging_dir = paths.normalize(self.logging_dir, "logging_dir")
            paths.check(self.logging_dir)
        if self.logging_dir is None:
            self.logging_dir = self.project_dir
        if self.total_limit is not None and (isinstance(self.total_limit, bool) or self.total_limit < 1):
            raise ValueError(
                f"ProjectConfiguration(total_limit={self.total_limit!r}) must be None or an int >= 1."
            )


@dataclasses.dataclass
class DataLoaderConfiguration:
    """How prepared data loaders share data between processes.

    Args:
        split_batches: cut each batch into one slice per process (the batch size is global and
            must be a multiple of the number of processes) instead of one batch per process.
        dispatch_batches: rank 0 loads and broadcasts; ``None`` means for iterable datasets only.
        even_batches: complete a final step the processes cannot share evenly with items from
            the start of the epoch (``gather_for_metrics`` drops them again).
        use_seedable_sampler: also make a ``RandomSampler`` that has a generator of its own
            (``DataLoader(shuffle=True, generator=g)``) a :class:`~drivetrain.utils.SeedableRandomSampler`.
            Without a generator of its own a shuffling sampler is made seedable anyway: every
            epoch's order depends only on ``(data_seed, epoch)``.
        data_seed: the seed of the shuffled order (default: ``torch.initial_seed()`` of rank 0, so
            ``set_seed`` decides).
        non_blocking: accepted for compatibility; host-to-accelerator copies are always non-blocking.
        use_stateful_dataloader: accepted for compatibility; prepared loaders always save their
            position in ``save_state``.
    """

    split_batches: bool = False
    dispatch_batches: bool | None = None
    even_batches: bool = True
    use_seedable_sampler: bool = False
    data_seed: int | None = None
    non_blocking: bool = False
    use_stateful_dataloader: bool = False

    def __post_init__(self) -> None:
        for name in (
            "split_batches",
            "even_batches",
            "use_seedable_sampler",
            "non_blocking",
            "use_stateful_dataloader",
        ):
            check_flag(name, getattr(self, name))
        if self.dispatch_batches is not None:
            check_flag("dispatch_batches", self.dispatch_batches, none_means="for iterable datasets only")
        if self.data_seed is not None and (
            isinstance(self.data_seed, bool) or not isinstance(self.data_seed, int)
        ):
            raise TypeError(
                f"data_seed expects an int or None, got {type(self.data_seed).__name__} ({self.data_seed!r})."
            )


@dataclasses.dataclass
class GradientAccumulationPlugin:
    """Gradient accumulation settings.

    Args:
        num_steps: batches per optimizer step.
        adjust_scheduler: accepted for compatibility (the prepared scheduler always steps only
            when the optimizer did).
        sync_with_dataloader: also step at the last batch of a prepared loader.
        sync_each_batch: synchronise gradients at every batch (less memory, more communication);
            the optimizer still steps every ``num_steps`` batches.
    """

    num_steps: int | None = None
    adjust_scheduler: bool = True
    sync_with_dataloader: bool = True
    sync_each_batch: bool = False


def check_flag(name: str, value: object, none_means: str | None = None) -> None:
    """A ``TypeError`` naming ``name`` unless ``value`` is ``True`` or ``False`` (a truthy string is not)."""
    if isinstance(value, bool):
        return
    allowed = "True or False" + (f" (or None: {none_means})" if none_means else "")
    raise TypeError(f"{name} expects {allowed}, got {type(value).__name__} ({value!r}).")
