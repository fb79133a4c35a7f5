"""Memory helpers from ``accelerate.utils``: ``release_memory``, ``find_executable_batch_size``.

``find_executable_batch_size`` is the one batch-size search of the project: it retries a
function with a smaller batch size (90 % of the last, as Accelerate 1.x, or your reduction)
while the device runs out of memory. :func:`search_batch_size` (the Trainer's
``Tuner.scale_batch_size`` and ``BatchSizeFinder``) starts with it, halving as Lightning's tuner
does, and then grows the batch while it fits, with the same out-of-memory detection.
"""

from __future__ import annotations

import functools
import gc
import inspect
from collections.abc import Callable
from typing import Any, TypeVar

from drivetrain.utils.current import current_strategy

F = TypeVar("F", bound=Callable[..., Any])

# What torch's allocators say when memory runs out (CUDA, cuDNN's workspace, the CPU, XPU, MPS).
_OUT_OF_MEMORY = (
    "out of memory",
    "cuDNN error: CUDNN_STATUS_NOT_SUPPORTED.",
    "DefaultCPUAllocator: can't allocate memory",
    "CUDNN_STATUS_ALLOC_FAILED",
)


def _empty_device_cache() -> None:
    strategy = current_strategy()
    if strategy is not None:
        strategy.accelerator.empty_cache()
        return
    from drivetrain.accelerators import CUDAAccelerator

    if CUDAAccelerator.is_available():
        CUDAAccelerator().empty_cache()


def release_memory(*objects: Any) -> list[None]:
    """Collect garbage and empty the device's cache; returns one ``None`` per object, to rebind them.

    >>> model, optimizer = release_memory(model, optimizer)  # doctest: +SKIP
    """
    gc.collect()
    _empty_device_cache()
    return [None] * len(objects)


def should_reduce_batch_size(exception: BaseException) -> bool:
    """Whether ``exception`` says the device ran out of memory (a smaller batch may fit)."""
    import torch

    if isinstance(exception, torch.OutOfMemoryError):
        return True
    return (
        isinstance(exception, RuntimeError)
        and len(exception.args) == 1
        and any(text in str(exception.args[0]) for text in _OUT_OF_MEMORY)
    )


def _reduction(
    reduce_batch_size_fn: Callable[..., int] | None, current: Callable[[], int]
) -> Callable[[], int]:
    """The next batch size after an out-of-memory error, as a function of nothing.

    Accelerate's ``reduce_batch_size_fn`` takes no arguments (it keeps the size itself); one that
    takes an argument is given the size that did not fit.
    """
    if reduce_batch_size_fn is None:
        return lambda: int(current() * 0.9)
    try:
        parameters = inspect.signature(reduce_batch_size_fn).parameters.values()
    except (TypeError, ValueError):  # a builtin without a signature: call it as Accelerate does
        return reduce_batch_size_fn
    takes_size = any(
        p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL) for p in parameters
    )
    if takes_size:
        return lambda: reduce_batch_size_fn(current())
    return reduce_batch_size_fn


def find_executable_batch_size(
    function: F | None = None,
    starting_batch_size: int = 128,
    reduce_batch_size_fn: Callable[..., int] | None = None,
) -> Any:
    """Decorator: call ``function(batch_size, ...)``, with a smaller ``batch_size`` after each out-of-memory error.

    The decorated function takes the batch size as its first argument and is called without it::

        @find_executable_batch_size(starting_batch_size=64)
        def train(batch_size, model):
            ...

        train(model)

    As in Accelerate 1.x, the batch size after a failure is ``int(0.9 * batch_size)`` unless
    ``reduce_batch_size_fn`` says otherwise, and the size that worked is kept: a second call of
    ``train`` starts from it.

    Args:
        function: the function (when used as ``@find_executable_batch_size`` without arguments).
        starting_batch_size: the first batch size tried.
        reduce_batch_size_fn: returns the next batch size after a failure. Accelerate's form takes no
            arguments; one that takes an argument is given the batch size that did not fit
            (``lambda size: size // 2`` halves).

    Raises:
        TypeError: the decorated function is called with a batch size of its own.
        RuntimeError: no batch size down to 1 fits ("No executable batch size found, reached zero").
    """
    if (
        isinstance(starting_batch_size, bool)
        or not isinstance(starting_batch_size, int)
        or starting_batch_size < 1
    ):
        raise ValueError(f"starting_batch_size must be an int >= 1, got {starting_batch_size!r}.")
    if reduce_batch_size_fn is not None and not callable(reduce_batch_size_fn):
        raise TypeError(
            f"reduce_batch_size_fn must be a function returning the next batch size, got {reduce_batch_size_fn!r}."
        )
    if function is None:
        return functools.partial(
            find_executable_batch_size,
            starting_batch_size=starting_batch_size,
            reduce_batch_size_fn=reduce_batch_size_fn,
        )
    batch_size = starting_batch_size
    reduce = _reduction(reduce_batch_size_fn, lambda: batch_size)

    @functools.wraps(function)
    def search(*args: Any, **kwargs: Any) -> Any:
        nonlocal batch_size
        parameters = list(inspect.signature(function).parameters)
        if len(parameters) < len(args) + 1:
            raise TypeError(
                f"{function.__name__}() gets the batch size from find_executable_batch_size as its first argument, "
                f"but was called with {len(args)} positional argument(s) for its {len(parameters)} parameter(s) "
                f"({', '.join(parameters)}). Leave the batch size out of the call."
            )
        while True:
            if batch_size < 1:
                raise RuntimeError(
                    "No executable batch size found, reached zero: even the smallest batch tried ran out of memory."
                )
            try:
                return function(batch_size, *args, **kwargs)
            except Exception as error:
                if not should_reduce_batch_size(error):
                    raise
                del error
                release_memory()
                smaller = reduce()
                if isinstance(smaller, bool) or not isinstance(smaller, int):
                    raise TypeError(
                        f"reduce_batch_size_fn returned {smaller!r}; it must return the next batch size as an int."
                    ) from None
                batch_size = smaller

    return search


def search_batch_size(
    trial: Callable[[int], Any],
    *,
    init_val: int = 2,
    mode: str = "power",
    max_trials: int = 25,
    max_val: int | None = None,
) -> int:
    """The largest batch size for which ``trial(batch_size)`` runs without running out of memory.

    The batch-size search of the Trainer's tuner, built on :func:`find_executable_batch_size`: from
    ``init_val`` the batch is halved after each out-of-memory error until one fits (that decorator's
    loop, with halving as the reduction); from there it doubles while trials fit. ``mode="power"`` stops at the last power-of-two
    multiple that fitted; ``"binsearch"`` then bisects between it and the first size that did not.

    Args:
        trial: runs a few steps at a batch size; raises an out-of-memory error
            (:func:`should_reduce_batch_size`) when that size does not fit.
        init_val: the first batch size tried.
        mode: ``"power"`` or ``"binsearch"``.
        max_trials: the most trials of the growing and bisecting phases (the halving phase runs until
            a size fits).
        max_val: never try more than this (the size of the data set, when known).

    Raises:
        RuntimeError: not even a batch of 1 fits.
    """
    if mode not in ("power", "binsearch"):
        raise ValueError(f"mode={mode!r} is not a batch-size search; use 'power' or 'binsearch'.")
    for name, value in (("init_val", init_val), ("max_trials", max_trials)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an int >= 1, got {value!r}.")
    if max_val is not None and max_val < 1:
        raise ValueError(f"max_val must be None or an int >= 1, got {max_val!r}.")
    trials = 0

    def run(batch_size: int) -> int:
        nonlocal trials
        trials += 1
        trial(batch_size)
        return batch_size

    def fits(batch_size: int) -> bool:
        try:
            run(batch_size)
        except Exception as error:
            if not should_reduce_batch_size(error):
                raise
            del error
            release_memory()
            return False
        return True

    start = min(init_val, max_val) if max_val is not None else init_val
    # Halve, as Lightning's tuner does (the decorator's own default takes 90 %).
    low: int = find_executable_batch_size(
        run, starting_batch_size=start, reduce_batch_size_fn=lambda size: size // 2
    )()
    high: int | None = None
    while trials < max_trials and (max_val is None or low < max_val):
        candidate = low * 2 if max_val is None else min(low * 2, max_val)
        if not fits(candidate):
            high = candidate
            break
        low = candidate
    if mode == "binsearch" and high is not None:
        while high - low > 1 and trials < max_trials:
            middle = (low + high) // 2
            if fits(middle):
                low = middle
            else:
                high = middle
    return low
