"""``LambdaCallback``: a callback made of functions, one per hook, without writing a class."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from drivetrain.trainer.callbacks.callback import Callback
from drivetrain.trainer.hooks import HOOKS


class LambdaCallback(Callback):
    """Run the given functions at the hooks they are named after.

    Each function takes the hook's arguments, as a callback method would without ``self``:
    ``(trainer, pl_module, *args)``. Hooks not given cost nothing (the Trainer calls only
    hooks that something overrides).

    Args:
        **hooks: hook name (``on_train_epoch_end``, ``on_train_batch_end``, ``setup`` … any hook of
            :class:`~drivetrain.trainer.callbacks.Callback`) to function.

    Example:
        >>> from drivetrain.trainer.callbacks import LambdaCallback
        >>> announce = LambdaCallback(on_train_epoch_end=lambda trainer, module: print(trainer.current_epoch))
    """

    def __init__(self, **hooks: Callable[..., Any] | None) -> None:
        unknown = sorted(name for name in hooks if name not in HOOKS)
        if unknown:
            raise ValueError(
                f"LambdaCallback got {', '.join(unknown)}, which {'is not a hook' if len(unknown) == 1 else 'are not hooks'}. "
                f"Use the names of Callback hooks: {', '.join(sorted(HOOKS))}."
            )
        for name, function in hooks.items():
            if function is None:
                continue  # Lightning's LambdaCallback(on_x=None): the hook is not used
            if not callable(function):
                raise TypeError(
                    f"LambdaCallback({name}={function!r}): give a function (or None), not a value."
                )
            # Set on the instance, the function is called as fn(trainer, pl_module, *args).
            setattr(self, name, function)
        self._hook_names = tuple(sorted(name for name, fn in hooks.items() if fn is not None))

    def __repr__(self) -> str:
        return f"LambdaCallback({', '.join(self._hook_names)})"
