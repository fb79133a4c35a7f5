"""Accelerate's free ``prepare_data_loader`` (``accelerate.data_loader``), with or without an Accelerator.

``Accelerator.prepare`` is the usual way; this function serves scripts that prepare a loader with
Accelerate's explicit arguments. While a ``drivetrain.Accelerator`` (or ``PartialState``) is alive
in the process, the processes sharing the data are that run's: ``num_processes`` and
``process_index`` default to it and must describe it. Without one, the loader is this process's
share for the ``num_processes`` and ``process_index`` given (default: 1 and 0), computed here
alone: no process group is needed, and none is used.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.data import DataLoader, IterableDataset

from drivetrain.connector import connect
from drivetrain.data.prepare import prepare_data_loader as prepare
from drivetrain.utils.current import current_strategy

if TYPE_CHECKING:
    from drivetrain.data.loader import PreparedDataLoader
    from drivetrain.strategies.strategy import Strategy


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
    torch_device_mesh: Any = None,
) -> PreparedDataLoader:
    """This process's share of ``dataloader`` (Accelerate's arguments; see ``Accelerator.prepare_data_loader``).

    Args:
        device: where ``put_on_device`` puts the batches (default: the run's device, else the CPU).
        num_processes: how many processes share the data (default: the run's, else 1).
        process_index: which share this process reads, ``0 <= process_index < num_processes``
            (default: the run's rank, else 0).
        dispatch_batches: process 0 loads and sends each batch (needs ``put_on_device`` and a
            running job); default ``False``, or for iterable datasets ``put_on_device``, as in Accelerate.
        rng_types: generators to copy from process 0 at each epoch start (needs a running job
            when several processes share the data).

    The other arguments are ``Accelerator.prepare``'s (``DataLoaderConfiguration``).

    Raises:
        ValueError: values that do not describe the run, a share out of range, dispatching or
            generator synchronisation without a running job, ``slice_fn_for_dispatch``,
            ``use_stateful_dataloader`` or ``torch_device_mesh``.
    """

    for name, value in (
        ("slice_fn_for_dispatch", slice_fn_for_dispatch),
        ("torch_device_mesh", torch_device_mesh),
    ):
        if value is not None:
            raise ValueError(
                f"prepare_data_loader({name}=...) is not supported: dispatched batches are sliced along dimension 0, "
                f"and the data-parallel ranks of a layout come from Accelerator(parallelism_config=...)."
            )
    if use_stateful_dataloader:
        raise ValueError(
            "prepare_data_loader(use_stateful_dataloader=True) is not supported: a prepared loader's position is "
            "saved and restored by Accelerator.save_state/load_state. Leave it out."
        )
    if dispatch_batches is None:
        dispatch_batches = put_on_device and isinstance(dataloader.dataset, IterableDataset)
    if dispatch_batches and not put_on_device:
        raise ValueError(
            "prepare_data_loader(dispatch_batches=True) needs put_on_device=True, as in Accelerate."
        )
    strategy = current_strategy()
    share = None
    # A one-process run has nothing to contradict: explicit shares are computed as without a run (the
    # answer must not depend on whether some Accelerator of one process happens to be alive).
    asks_for_shares = num_processes not in (None, 1) or process_index not in (None, 0)
    if strategy is None or (strategy.world_size == 1 and asks_for_shares):
        strategy, share = _standalone(device, num_processes, process_index, rng_types)
    else:
        _check_run(strategy, device, num_processes, process_index)
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
        share=share,
    )


def _check_run(strategy: Strategy, device: Any, num_processes: int | None, process_index: int | None) -> None:
    for name, given, actual in (
        ("num_processes", num_processes, strategy.world_size),
        ("process_index", process_index, strategy.global_rank),
    ):
        if given is not None and given != actual:
            raise ValueError(
                f"prepare_data_loader({name}={given}) does not match this run ({name}={actual}): while an Accelerator "
                f"runs, drivetrain shares data among the run's processes. Leave {name} out, or pass the run's value."
            )
    if device is not None and torch.device(device) != strategy.root_device:
        raise ValueError(
            f"prepare_data_loader(device={device!r}) is not this process's device ({strategy.root_device}); leave "
            f"device out."
        )


def _standalone(
    device: Any, num_processes: int | None, process_index: int | None, rng_types: Iterable[Any] | None
) -> tuple[Strategy, tuple[int, int]]:
    """A one-process strategy on ``device`` and the share to shard for, checked."""

    processes = 1 if num_processes is None else num_processes
    index = 0 if process_index is None else process_index
    for name, value, low in (("num_processes", processes, 1), ("process_index", index, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"prepare_data_loader({name}={value!r}): give an int >= {low}.")
    if index >= processes:
        raise ValueError(
            f"prepare_data_loader(process_index={index}) is not one of the {processes} processes: use 0 to "
            f"{processes - 1}."
        )
    if processes > 1 and rng_types:
        raise ValueError(
            f"prepare_data_loader(rng_types={list(rng_types)!r}) copies generators from process 0 to the others, which "
            f"needs the processes of a running job; without an Accelerator there is none. Leave rng_types out (seed "
            f"each process alike), or create the Accelerator first."
        )
    place = torch.device(device) if device is not None else torch.device("cpu")
    devices: Any = 1 if place.index is None else [place.index]
    strategy = connect(accelerator=place.type, strategy="single_device", devices=devices)
    return strategy, (processes, index)
