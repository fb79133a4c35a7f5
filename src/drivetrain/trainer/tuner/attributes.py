"""The hyperparameter a search updates: an attribute, or an ``hparams`` entry, of the module and DataModule.

As in Lightning, ``name`` is looked up on the module (attribute and ``hparams`` entry) and on the
Trainer's DataModule (the same); reading takes the last place that has it, setting sets every
place, so a ``train_dataloader()`` or ``configure_optimizers()`` reading any of them sees the new value.
"""

from __future__ import annotations

from typing import Any


def _holders(module: Any, datamodule: Any, name: str) -> list[tuple[Any, bool]]:
    """(object, through hparams) for each place holding ``name``: the attribute and the ``hparams`` entry
    both, when an owner has both (Lightning sets every one, so ``self.lr`` and ``self.hparams.lr`` agree)."""
    found = []
    for owner in (module, datamodule):
        if owner is None:
            continue
        hparams = owner.__dict__.get("_hparams")
        if name in vars(owner) or hasattr(type(owner), name):
            found.append((owner, False))
        if isinstance(hparams, dict) and name in hparams:
            found.append((hparams, True))
    return found


def has_attribute(module: Any, datamodule: Any, name: str) -> bool:
    return bool(_holders(module, datamodule, name))


def get_attribute(module: Any, datamodule: Any, name: str) -> Any:
    """The value of ``name`` (the DataModule's when both have it, as the loaders come from there)."""
    holders = _holders(module, datamodule, name)
    if not holders:
        raise AttributeError(name)
    owner, in_hparams = holders[-1]
    return owner[name] if in_hparams else getattr(owner, name)


def set_attribute(module: Any, datamodule: Any, name: str, value: Any) -> None:
    for owner, in_hparams in _holders(module, datamodule, name):
        if in_hparams:
            owner[name] = value
        else:
            setattr(owner, name, value)


def find_lr_attribute(module: Any, datamodule: Any, attr_name: str) -> str:
    """``attr_name``, or the first of ``lr``/``learning_rate`` the module or DataModule holds."""
    if attr_name:
        if not has_attribute(module, datamodule, attr_name):
            raise AttributeError(
                f"LR finder: attr_name={attr_name!r}, but neither {type(module).__name__} nor its DataModule has an "
                f"attribute or hparams entry of that name. Name the attribute configure_optimizers() reads, or pass "
                f"update_attr=False."
            )
        return attr_name
    for candidate in ("lr", "learning_rate"):
        if has_attribute(module, datamodule, candidate):
            return candidate
    raise AttributeError(
        f"LR finder: update_attr=True, but {type(module).__name__} has no 'lr' or 'learning_rate' attribute or "
        f"hparams entry to update. Give it one (read by configure_optimizers()), pass attr_name=..., or pass "
        f"update_attr=False and read the suggestion from the result."
    )
