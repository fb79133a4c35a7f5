"""``Trainer(profiler=...)``: which profiler a run uses, and timing wrappers put in place once per run.

Nothing is wrapped when no profiler was asked for, so an unprofiled step costs nothing extra.
With one, the Trainer times ``run_training_epoch``, ``run_training_batch``, ``training_step``,
``backward``, ``optimizer_step``, ``train_dataloader_next``, the evaluation steps and every hook a
module or callback overrides (``[Callback]ModelCheckpoint{...}.on_train_batch_end``,
``[TrainingModule]Model.on_train_epoch_end`` …).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from drivetrain.profilers import Profiler

_NAMES = ("simple", "advanced", "pytorch")


def resolve_profiler(value: Any) -> Profiler | None:
    """``None`` (no profiling), a name (``"simple"``, ``"advanced"``, ``"pytorch"``) or a Profiler instance."""
    if value is None:
        return None
    from drivetrain.profilers import AdvancedProfiler, Profiler, PyTorchProfiler, SimpleProfiler

    if isinstance(value, Profiler):
        return value
    if isinstance(value, str):
        kinds: dict[str, Callable[[], Profiler]] = {
            "simple": SimpleProfiler,
            "advanced": AdvancedProfiler,
            "pytorch": PyTorchProfiler,
        }
        name = value.strip().lower()
        if name in kinds:
            return kinds[name]()
        import difflib

        close = difflib.get_close_matches(name, _NAMES, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ValueError(
            f"profiler={value!r} is not a profiler name; use one of {', '.join(map(repr, _NAMES))}, a "
            f"drivetrain.profilers.Profiler instance, or None.{hint}"
        )
    raise TypeError(
        f"profiler= expects a name ({', '.join(map(repr, _NAMES))}), a drivetrain.profilers.Profiler instance or "
        f"None, got {type(value).__name__} ({value!r})."
    )


def timed(profiler: Profiler | None, action: str, function: Callable[..., Any]) -> Callable[..., Any]:
    """``function``, recorded as ``action`` by ``profiler`` on each call (itself when there is no profiler)."""
    if profiler is None:
        return function
    start, stop = profiler.start, profiler.stop

    def call(*args: Any, **kwargs: Any) -> Any:
        start(action)
        try:
            return function(*args, **kwargs)
        finally:
            stop(action)

    return call


def timed_batches(profiler: Profiler | None, action: str, batches: Iterable[Any]) -> Iterator[Any]:
    """``batches``, with each fetch recorded as ``action`` (the iterator itself without a profiler)."""
    iterator = iter(batches)
    if profiler is None:
        return iterator
    return _timed_fetches(profiler, action, iterator)


def _timed_fetches(profiler: Profiler, action: str, iterator: Iterator[Any]) -> Iterator[Any]:
    while True:
        profiler.start(action)
        try:
            batch = next(iterator)
        except StopIteration:
            return
        finally:
            profiler.stop(action)
        yield batch
