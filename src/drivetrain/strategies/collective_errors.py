"""The errors the collective checks raise (their own module: raising one needs no monitor thread code)."""


class CollectiveMismatchError(RuntimeError):
    """Ranks called different collectives, or the same one with tensors of different shapes or dtypes."""


class CollectiveStuckError(RuntimeError):
    """A collective waited ``stall_timeout`` for ranks that are elsewhere and making no progress."""
