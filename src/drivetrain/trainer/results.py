"""What ``self.log`` stores, and how logged values become step, epoch and callback metrics.

``self.log`` is on the per-step path, so it does as little as possible: it finds the metric's
slot, detaches the tensor and keeps it. Nothing is converted to a Python number (no device
sync) and nothing crosses processes until the values are needed: every ``log_every_n_steps``
(the logger), when the progress bar refreshes (rank 0 only), and at epoch end (the epoch
value, reduced across ranks).

Inside batch loops (``training_step``, ``validation_step``, the batch hooks) values are
accumulated over the epoch; outside them (epoch start/end hooks) a logged value is final at
once, so callbacks running right after the module's ``on_*_epoch_end`` see it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import Tensor

REDUCE_FUNCTIONS = ("mean", "sum", "max", "min")
_REDUCE_ALIASES: dict[Any, str] = {torch.mean: "mean", torch.sum: "sum", torch.max: "max", torch.min: "min"}
#: Accumulated values are folded into one partial result every this many entries.
_COMPACT_EVERY = 1024


class _Slot:
    """One logged name in one stage: its options and what has been logged so far."""

    __slots__ = (
        "epoch_key",
        "fast",
        "last",
        "mark",
        "name",
        "on_epoch",
        "on_step",
        "options",
        "prog_bar",
        "reduce",
        "step_key",
        "sync",
        "sync_epoch",
        "to_logger",
        "values",
        "weights",
    )

    def __init__(
        self,
        name: str,
        options: tuple[Any, ...],
        *,
        on_step: bool,
        on_epoch: bool,
        prog_bar: bool,
        to_logger: bool,
        reduce: str,
        sync: bool,
        sync_epoch: bool,
    ) -> None:
        self.name = name
        self.options = options
        self.on_step = on_step
        self.on_epoch = on_epoch
        self.prog_bar = prog_bar
        self.to_logger = to_logger
        self.reduce = reduce
        self.sync = sync
        self.sync_epoch = sync_epoch
        both = on_step and on_epoch
        self.step_key = f"{name}_step" if both else name
        #: A per-step value that is only ever replaced: the hot path of self.log (see ResultCollection.log).
        self.fast = on_step and not on_epoch and not sync
        self.epoch_key = f"{name}_epoch" if both else name
        self.last: Tensor | float | None = None
        self.mark = -1
        self.values: list[Tensor | float] = []
        self.weights: list[int] = []


class ResultCollection:
    """The values logged during one stage (training, validating, testing, predicting).

    Args:
        training: whether this is the training stage (its batch hooks default to ``on_step=True``).
        all_reduce: the strategy's ``all_reduce`` when several processes take part, else ``None``.
        all_gather_object: the strategy's ``all_gather_object`` (with ``all_reduce``).
    """

    def __init__(
        self,
        training: bool,
        all_reduce: Callable[..., Tensor] | None = None,
        all_gather_object: Callable[[Any], list[Any]] | None = None,
    ) -> None:
        self.training = training
        self.slots: dict[str, _Slot] = {}
        #: Slots whose values ``TrainingModule.log`` may store directly (the hot path), by name;
        #: empty outside batch loops.
        self.fast: dict[str, _Slot] = {}
        self._fast: dict[str, _Slot] = {}
        self._batch_level = False
        #: Bumped by the loop once per batch; marks which values were logged in the current batch.
        self.mark = 0
        self.batch: Any = None
        self.suffix = ""
        self.epoch_values: dict[str, Tensor] = {}
        self._all_reduce = all_reduce
        self._all_gather_object = all_gather_object
        self._batch_size: tuple[int, int] = (-1, 1)

    @property
    def batch_level(self) -> bool:
        """Inside a batch loop (values accumulate) or in an epoch-level hook (values are final)."""
        return self._batch_level

    @batch_level.setter
    def batch_level(self, value: bool) -> None:
        self._batch_level = value
        self.fast = self._fast if value else {}

    # -- the per-step path ----------------------------------------------------------------
    def log(
        self,
        name: str,
        value: Any,
        prog_bar: bool,
        logger: bool,
        on_step: bool | None,
        on_epoch: bool | None,
        reduce_fx: Any,
        sync_dist: bool | None,
        batch_size: int | None,
    ) -> None:
        key = name + self.suffix if self.suffix else name
        slot = self.slots.get(key)
        options = (prog_bar, logger, on_step, on_epoch, reduce_fx, sync_dist, self.batch_level)
        if slot is None or (slot.options is not options and slot.options != options):
            if isinstance(value, Tensor) and value.numel() != 1:  # checked once per name, off the step path
                raise ValueError(_not_scalar(name, value))
            slot = self._new_slot(key, name, options)
        if slot.fast and self._batch_level and type(value) is Tensor:
            # Kept as given and detached when read: a per-step loss holds nothing a hand-written loop's
            # `loss` variable would not (its graph's buffers are freed by backward), until the next step.
            slot.last = value
            slot.mark = self.mark
            return
        if isinstance(value, Tensor):
            if value.numel() != 1:
                raise ValueError(_not_scalar(name, value))
            value = value.detach()
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            value = float(value)
        else:
            raise TypeError(_bad_value(name, value))
        if slot.sync and self._all_reduce is not None:
            value = self._all_reduce(
                value if isinstance(value, Tensor) else torch.tensor(value), reduce_op=slot.reduce
            )
        slot.mark = self.mark
        if not self.batch_level:
            # Outside a batch loop the value is the epoch's value (last call wins).
            self.epoch_values[key] = self._final(slot, value)
            slot.last = value
            return
        if slot.on_step:
            slot.last = value
        if slot.on_epoch:
            slot.values.append(value)
            if slot.reduce == "mean":
                slot.weights.append(batch_size if batch_size is not None else self._current_batch_size())
            if len(slot.values) >= _COMPACT_EVERY:
                _compact(slot)

    # -- creating slots ------------------------------------------------------------------------
    def _new_slot(self, key: str, name: str, options: tuple[Any, ...]) -> _Slot:
        prog_bar, logger, on_step, on_epoch, reduce_fx, sync_dist, batch_level = options
        if not isinstance(name, str) or not name:
            raise TypeError(f"self.log expects a non-empty string name, got {name!r}.")
        reduce = _REDUCE_ALIASES.get(reduce_fx, reduce_fx)
        if reduce not in REDUCE_FUNCTIONS:
            raise ValueError(
                f"self.log({name!r}, ..., reduce_fx={reduce_fx!r}): use one of {', '.join(REDUCE_FUNCTIONS)} "
                f"(or torch.mean/sum/max/min)."
            )
        step_default = self.training and batch_level
        on_step = step_default if on_step is None else bool(on_step)
        on_epoch = (not step_default) if on_epoch is None else bool(on_epoch)
        if on_step and not batch_level:
            raise ValueError(
                f"self.log({name!r}, ..., on_step=True) was called outside a batch loop (in an epoch-level hook), "
                f"where there is no step to log at. Leave on_step unset there, or log from a *_step/batch hook."
            )
        if not on_step and not on_epoch:
            raise ValueError(
                f"self.log({name!r}, ..., on_step=False, on_epoch=False) would record nothing. Set on_step=True "
                f"(log each step) or on_epoch=True (log the epoch's {reduce})."
            )
        slot = _Slot(
            key,
            options,
            on_step=on_step,
            on_epoch=on_epoch,
            prog_bar=bool(prog_bar),
            to_logger=bool(logger),
            reduce=reduce,
            # Step values cross processes at log time only when asked (sync_dist=True): a
            # collective per call. Epoch values are reduced at epoch end unless sync_dist=False.
            sync=bool(sync_dist) and on_step,
            sync_epoch=(self._all_reduce is not None) if sync_dist is None else bool(sync_dist),
        )
        existing = self.slots.get(key)
        slot_key = key
        if (
            existing is not None
            and existing.options[-1] != batch_level
            and not _same_settings(existing, slot)
        ):
            # Logged under this name both in a batch loop and in an epoch-level hook (training_step and
            # on_train_epoch_end), with other settings: two values, as Lightning keeps one per hook; the
            # epoch-level one is the epoch's value under the plain name.
            slot_key = key + (_BATCH_LEVEL if batch_level else _EPOCH_LEVEL)
            existing = self.slots.get(slot_key)
        if existing is not None:
            if not _same_settings(existing, slot):
                raise ValueError(
                    f"{name!r} is logged in two places with different settings "
                    f"(on_step={existing.on_step}, on_epoch={existing.on_epoch}, prog_bar={existing.prog_bar}, "
                    f"logger={existing.to_logger}, reduce_fx={existing.reduce!r} before; on_step={slot.on_step}, "
                    f"on_epoch={slot.on_epoch}, prog_bar={slot.prog_bar}, logger={slot.to_logger}, "
                    f"reduce_fx={slot.reduce!r} now). Use one set of settings, or two names."
                )
            existing.options = options  # same meaning, other spelling: remember this one too
            slot = existing
        elif slot.sync and self._all_gather_object is not None:
            _check_same_name_everywhere(slot_key, self._all_gather_object)
        self.slots[slot_key] = slot
        if slot.fast and batch_level and not self.suffix and slot_key == key:
            self._fast[key] = slot
            self.fast = self._fast if self._batch_level else {}
        return slot

    def _current_batch_size(self) -> int:
        mark, size = self._batch_size
        if mark != self.mark:
            size = infer_batch_size(self.batch)
            self._batch_size = (self.mark, size)
        return size

    def _final(self, slot: _Slot, value: Tensor | float) -> Tensor:
        tensor = value if isinstance(value, Tensor) else torch.tensor(value)
        if self._all_reduce is not None and slot.sync_epoch and not slot.sync:
            tensor = self._all_reduce(tensor, reduce_op=slot.reduce)
        return tensor

    # -- reading -----------------------------------------------------------------------------
    def step_metrics(self, for_logger: bool = True) -> dict[str, Tensor | float]:
        """The values logged in the current batch (for the logger) under their step names."""
        mark = self.mark
        return {
            slot.step_key: slot.last
            for slot in self.slots.values()
            if slot.on_step
            and slot.mark == mark
            and slot.last is not None
            and (slot.to_logger or not for_logger)
        }

    def live_metrics(self, prog_bar_only: bool = False) -> dict[str, Tensor | float]:
        """The latest step values this epoch.

        For callbacks, under ``name`` and, when the value is logged ``on_epoch`` too, ``name_step``;
        for the progress bar (``prog_bar_only``) under ``name_step`` alone, as Lightning shows it.
        """
        metrics: dict[str, Tensor | float] = {}
        for slot in self.slots.values():
            if slot.on_step and slot.last is not None and (slot.prog_bar or not prog_bar_only):
                metrics[slot.step_key] = _detached(slot.last)
                if not prog_bar_only:
                    metrics[slot.name] = metrics[slot.step_key]
        return metrics

    def epoch_metrics(self, prog_bar_only: bool = False, logger_only: bool = False) -> dict[str, Tensor]:
        """The epoch values computed so far (after :meth:`reduce_epoch`, and from epoch-level hooks).

        All of them under every name (for callbacks); for the progress bar or the loggers under one
        name each: ``name_epoch`` when the value is logged ``on_step`` too, else ``name``.
        """
        if not prog_bar_only and not logger_only:
            return dict(self.epoch_values)
        chosen: dict[str, Tensor] = {}
        for slot in self.slots.values():
            if (prog_bar_only and not slot.prog_bar) or (logger_only and not slot.to_logger):
                continue
            if slot.epoch_key in self.epoch_values:
                chosen[slot.epoch_key] = self.epoch_values[slot.epoch_key]
        return chosen

    # -- epoch end ---------------------------------------------------------------------------
    def reduce_epoch(self) -> dict[str, Tensor]:
        """Reduce the values accumulated in the batch loop into epoch values (across ranks too)."""
        local = {key: slot for key, slot in self.slots.items() if slot.on_epoch and slot.values}
        results: dict[str, Tensor] = {}
        names: dict[str, tuple[str, str]] = {k: (s.epoch_key, s.name) for k, s in local.items()}
        if self._all_reduce is not None and self._all_gather_object is not None:
            # Every rank must reduce the same names in the same order, even a rank that saw no batch.
            announced = sorted((k, s.reduce, s.epoch_key) for k, s in local.items() if s.sync_epoch)
            union = sorted({tuple(item) for items in self._all_gather_object(announced) for item in items})
            results = _reduce_across(local, [(k, r) for k, r, _ in union], self._all_reduce)
            for key, _, epoch_key in union:
                names.setdefault(key, (epoch_key, key))
        for key, slot in local.items():
            if key not in results:
                results[key] = _reduce_local(slot)
            slot.values, slot.weights = [], []
        for key, value in results.items():
            epoch_key, name = names[key]
            self.epoch_values[epoch_key] = value
            self.epoch_values[name] = value
        return dict(self.epoch_values)

    def end_epoch(self) -> None:
        """Forget this epoch's step values (the epoch values stay until :meth:`reset`)."""
        for slot in self.slots.values():
            slot.last = None
            slot.values, slot.weights = [], []

    def reset(self) -> None:
        """Start a new epoch: no step or epoch values."""
        self.end_epoch()
        self.epoch_values = {}

    # -- checkpoints -------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The values accumulated so far this epoch, so a resumed run computes the same epoch values."""
        return {
            key: {
                "values": [v if isinstance(v, Tensor) else torch.tensor(v) for v in slot.values],
                "weights": list(slot.weights),
                "options": _plain_options(slot),
            }
            for key, slot in self.slots.items()
            if slot.values
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Recreate the slots a checkpoint had values for, with those values."""
        for key, entry in state.items():
            options = entry["options"]
            slot = _Slot(
                options.get("name", key),
                ("restored",),
                on_step=options["on_step"],
                on_epoch=options["on_epoch"],
                prog_bar=options["prog_bar"],
                to_logger=options["logger"],
                reduce=options["reduce"],
                sync=options["sync"],
                sync_epoch=options["sync_epoch"],
            )
            slot.values = list(entry["values"])
            slot.weights = list(entry["weights"])
            self.slots[key] = slot


#: Where a name's second slot is kept when it is logged both in a batch loop and in an epoch-level hook.
_EPOCH_LEVEL = "\x00epoch-level"
_BATCH_LEVEL = "\x00batch-level"


def _same_settings(existing: _Slot, new: _Slot) -> bool:
    return (existing.on_step, existing.on_epoch, existing.prog_bar, existing.to_logger, existing.reduce) == (
        new.on_step,
        new.on_epoch,
        new.prog_bar,
        new.to_logger,
        new.reduce,
    )


def _detached(value: Tensor | float) -> Tensor | float:
    return value.detach() if isinstance(value, Tensor) else value


def _plain_options(slot: _Slot) -> dict[str, Any]:
    return {
        "name": slot.name,
        "on_step": slot.on_step,
        "on_epoch": slot.on_epoch,
        "prog_bar": slot.prog_bar,
        "logger": slot.to_logger,
        "reduce": slot.reduce,
        "sync": slot.sync,
        "sync_epoch": slot.sync_epoch,
    }


def _as_tensors(values: list[Tensor | float]) -> Tensor:
    device = next((v.device for v in values if isinstance(v, Tensor)), torch.device("cpu"))
    return torch.stack(
        [v.reshape(()) if isinstance(v, Tensor) else torch.tensor(v, device=device) for v in values]
    )


def _partials(slot: _Slot) -> Tensor:
    """The slot's accumulated values as the partial results a reduction combines."""
    values = _as_tensors(slot.values).to(torch.float64 if _float64_ok(slot) else torch.float32)
    if slot.reduce == "mean":
        weights = torch.tensor(slot.weights, dtype=values.dtype, device=values.device)
        return torch.stack([(values * weights).sum(), weights.sum()])
    if slot.reduce == "sum":
        return values.sum().reshape(1)
    return (values.max() if slot.reduce == "max" else values.min()).reshape(1)


def _float64_ok(slot: _Slot) -> bool:
    first = slot.values[0]
    return not isinstance(first, Tensor) or first.device.type not in ("mps", "xla")


def _compact(slot: _Slot) -> None:
    # Keep memory bounded over long epochs: fold the entries into one equivalent partial entry.
    partial = _partials(slot)
    if slot.reduce == "mean":
        total = float(partial[1])
        slot.values = [partial[0] / total] if total else []
        slot.weights = [total] if total else []  # type: ignore[list-item]
    else:
        slot.values = [partial[0]]
        slot.weights = []


def _reduce_local(slot: _Slot) -> Tensor:
    partial = _partials(slot)
    if slot.reduce == "mean":
        return (partial[0] / partial[1]).to(torch.float32)
    return partial[0].to(torch.float32)


_NEUTRAL = {"sum": 0.0, "max": float("-inf"), "min": float("inf")}
_COLLECTIVE = {"mean": "sum", "sum": "sum", "max": "max", "min": "min"}


def _reduce_across(
    local: dict[str, _Slot], union: list[tuple[str, str]], all_reduce: Callable[..., Tensor]
) -> dict[str, Tensor]:
    """Reduce every announced name across ranks: one collective per kind of reduction."""
    groups: dict[str, list[tuple[str, str]]] = {}
    for key, reduce in union:
        groups.setdefault(_COLLECTIVE[reduce], []).append((key, reduce))
    device = next(
        (v.device for slot in local.values() for v in slot.values if isinstance(v, Tensor)),
        torch.device("cpu"),
    )
    results: dict[str, Tensor] = {}
    for op, names in groups.items():
        parts: list[Tensor] = []
        for key, reduce in names:
            slot = local.get(key)
            if slot is not None:
                parts.append(_partials(slot).to(device=device, dtype=torch.float64))
            elif reduce == "mean":
                parts.append(torch.zeros(2, dtype=torch.float64, device=device))
            else:
                parts.append(torch.full((1,), _NEUTRAL[reduce], dtype=torch.float64, device=device))
        reduced = all_reduce(torch.cat(parts), reduce_op=op)
        offset = 0
        for key, reduce in names:
            if reduce == "mean":
                total, weight = reduced[offset], reduced[offset + 1]
                results[key] = (total / weight).to(torch.float32)
                offset += 2
            else:
                results[key] = reduced[offset].to(torch.float32)
                offset += 1
    return results


def infer_batch_size(batch: Any) -> int:
    """The length of the first tensor found in ``batch`` (1 when there is none)."""
    if isinstance(batch, Tensor):
        return int(batch.shape[0]) if batch.dim() else 1
    if isinstance(batch, Mapping):
        for value in batch.values():
            return infer_batch_size(value)
        return 1
    if isinstance(batch, (list, tuple)) and batch:
        first = batch[0]
        if isinstance(first, (Tensor, Mapping, list, tuple)):
            return infer_batch_size(first)
        return len(batch)
    return 1


def _check_same_name_everywhere(key: str, all_gather_object: Callable[[Any], list[Any]]) -> None:
    """Every rank must be logging the same name where a step value is reduced across ranks.

    Otherwise the all-reduce silently averages different metrics (``self.log(f"acc_rank{rank}",
    sync_dist=True)``). Checked once per name, when its slot is created, never per step.
    """
    names = all_gather_object(key)
    if all(name == key for name in names):
        return
    ranks: dict[str, list[int]] = {}
    for rank, name in enumerate(names):
        ranks.setdefault(name, []).append(rank)
    detail = "; ".join(
        f"rank{'s' if len(r) > 1 else ''} {', '.join(map(str, r))}: {n!r}" for n, r in ranks.items()
    )
    raise ValueError(
        f"self.log(..., sync_dist=True) reduces a value across ranks, but the ranks log different names at the same "
        f"point ({detail}), so different metrics would be averaged together. Log the same name on every rank, or "
        f"pass sync_dist=False for a per-rank metric."
    )


def _not_scalar(name: str, value: Tensor) -> str:
    return (
        f"self.log({name!r}, value) got a tensor of shape {tuple(value.shape)} ({value.numel()} elements); a "
        f"metric is one number. Log a reduction (value.mean()), or each element under its own name "
        f"(self.log_dict({{f'{name}_{{i}}': v for i, v in enumerate(value)}}))."
    )


def _bad_value(name: str, value: Any) -> str:
    if all(callable(getattr(value, method, None)) for method in ("update", "compute", "reset")):
        # A torchmetrics Metric: Lightning computes and resets it for you; here you log its values.
        return (
            f"self.log({name!r}, metric) got the metric object {type(value).__name__}; drivetrain logs values, not "
            f"metric objects. Log the value of this batch (value = metric(preds, target); self.log({name!r}, value)), "
            f"or in on_*_epoch_end self.log({name!r}, metric.compute()) followed by metric.reset()."
        )
    return (
        f"self.log({name!r}, value) got {type(value).__name__} ({value!r}); log a number or a one-element "
        f"tensor. Use self.log_dict for several values."
    )


class DiscardedResults(ResultCollection):
    """What ``self.log`` writes to under ``Trainer(barebones=True)``: nothing is recorded (Lightning warns
    and drops the value too), so logging costs no reduction, no sync and no logger call."""

    def log(self, name: str, value: Any, *args: Any, **kwargs: Any) -> None:
        import warnings

        warnings.warn(
            f"self.log({name!r}, ...) does nothing under Trainer(barebones=True), which turns logging off. Drop "
            f"barebones=True to record logged values.",
            UserWarning,
            stacklevel=3,
        )


def collectives_of(strategy: Any) -> tuple[Any, Any]:
    """``(all_reduce, all_gather_object)`` of ``strategy`` for a collection, ``None`` for one process."""
    if strategy.world_size > 1:
        return strategy.all_reduce, strategy.all_gather_object
    return None, None


def new_results(features: Any, strategy: Any, training: bool) -> ResultCollection:
    """The collection a stage's logged values go to (nothing under ``barebones``), reduced across the run's processes."""
    kind = DiscardedResults if features.barebones else ResultCollection
    return kind(training, *collectives_of(strategy))
