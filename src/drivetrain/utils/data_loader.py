"""Accelerate's free ``prepare_data_loader`` (``accelerate.data_loader``), on the live Accelerator's processes.

``Accelerator.prepare`` is the usual way; this function serves scripts that prepare a loader
with Accelerate's explicit arguments. The processes sharing the data are the run's (the latest
live ``drivetrain.Accelerator``'s or ``PartialState``'s): ``num_processes`` and ``process_index``
must describe them.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.data import DataLoader

from drivetrain.utils.operations import _strategy

if TYPE_CHECKING:
    from drivetrain.data.loader import PreparedDataLoader


def prepare_data_loader(
    dataloader: DataLoader,
    device: torch.device | str | None = None,
    num_processes: int | None = None,
    process_index: int | None = None,
    split_batches: bool = False,
    put_on_device: bool = False,
    rng_types: Iterable[Any] | None = None,
    dispatch_batches: bool | None = None,
    even_batches: bool = True,
    slice_fn_for_dispatch: Any = None,
    use_seedable_sampler: bool = False,
    data_seed: int | None = None,
    non_blocking: bool = False,
    use_stateful_dataloader: bool = False,
) -> PreparedDataLoader:
    """This process's share of ``dataloader`` (see ``Accelerator.prepare_data_loader``).

    Raises:
        ValueError: ``num_processes``/``process_index``/``device`` that are not this run's, or
            ``slice_fn_for_dispatch`` (dispatched batches are sliced along dimension 0).
    """
    from drivetrain.data.prepare import prepare_data_loader as prepare

    strategy = _strategy("prepare_data_loader")
    for name, given, actual in (
        ("num_processes", num_processes, strategy.world_size),
        ("process_index", process_index, strategy.global_rank),
    ):
        if given is not None and given != actual:
            raise ValueError(
                f"prepare_data_loader({name}={given}) does not match this run ({name}={actual}): drivetrain shares "
                f"data among the run's processes. Leave {name} out, or pass the run's value."
            )
    if device is not None and torch.device(device) != strategy.root_device:
        raise ValueError(
            f"prepare_data_loader(device={device!r}) is not this process's device ({strategy.root_device}); leave "
            f"device out."
        )
    if slice_fn_for_dispatch is not None:
        raise ValueError("slice_fn_for_dispatch is not supported; dispatched batches are sliced along dim 0.")
    return prepare(
        dataloader,
        strategy,
        split_batches=split_batches,
        even_batches=even_batches,
        dispatch_batches=dispatch_batches,
        rng_types=rng_types,
        device_placement=put_on_device,
        data_seed=data_seed,
        use_seedable_sampler=use_seedable_sampler,
    )
