"""Turn a sharded checkpoint (FSDP or DeepSpeed) into one file loadable on a single device.

``consolidate_checkpoint(src, dst)`` (and the command ``drivetrain consolidate SRC DST``) reads
the layout of ``src`` and writes ``dst`` with ``torch.save``, atomically; the result loads with
``torch.load(dst, weights_only=True)`` in one process, without a process group or a GPU.
"""

from __future__ import annotations

from pathlib import Path

from drivetrain._utilities import paths


def _kind(path: str | Path) -> str | None:
    from drivetrain.strategies.deepspeed_checkpoint import is_deepspeed_checkpoint
    from drivetrain.strategies.fsdp_checkpoint import is_sharded_checkpoint

    if is_sharded_checkpoint(path):
        return "fsdp"
    if not paths.is_remote(path) and is_deepspeed_checkpoint(Path(path)):
        return "deepspeed"
    return None


def locate_checkpoint(path: str | Path) -> str | Path:
    """The sharded checkpoint at ``path``, or the one folder inside it that is one.

    ``Accelerator.save_state(dir)`` writes its sharded state as a folder inside ``dir``
    (``dir/state.ckpt``); Accelerate's FSDP states are ``dir/pytorch_model_fsdp_0``. Either
    ``dir`` or that folder may be given.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        ValueError: neither ``path`` nor exactly one folder inside it is a sharded checkpoint.
    """
    if not paths.exists(path):
        raise FileNotFoundError(f"No checkpoint at {path}.")
    if _kind(path) is not None:
        return path
    inside = [] if not paths.isdir(path) else [paths.join(path, name) for name in sorted(paths.listdir(path))]
    found = [child for child in inside if paths.isdir(child) and _kind(child) is not None]
    if len(found) == 1:
        return found[0]
    files = [
        child for child in inside if paths.isfile(child) and str(child).endswith((".ckpt", ".pt", ".bin"))
    ]
    if not found and files:
        raise ValueError(
            f"{path} holds no sharded checkpoint: {', '.join(map(str, files))} "
            f"{'is a single file' if len(files) == 1 else 'are single files'}, already consolidated (load "
            f"{'it' if len(files) == 1 else 'them'} with torch.load(..., weights_only=True))."
        )
    detail = (
        f"several are inside it ({', '.join(map(str, found))}): name the one to merge"
        if found
        else (
            "expected a directory written by FSDPStrategy.save_state (with DCP's .metadata) or by "
            "DeepSpeedStrategy.save_state (with a 'latest' file or a tag folder holding mp_rank_00_model_states.pt), "
            "or a folder holding one (as Accelerator.save_state writes: <dir>/state.ckpt)"
        )
    )
    raise ValueError(f"{path} is not a sharded checkpoint drivetrain knows: {detail}.")


def checkpoint_kind(path: str | Path) -> str:
    """``"fsdp"`` for a DCP directory, ``"deepspeed"`` for a DeepSpeed engine checkpoint (at ``path``
    or, as :func:`locate_checkpoint` finds it, inside it).

    Raises:
        FileNotFoundError: ``path`` does not exist.
        ValueError: it exists but holds neither layout.
    """
    kind = _kind(locate_checkpoint(path))
    assert kind is not None
    return kind


def consolidate_checkpoint(
    source: str | Path, destination: str | Path, *, weights_only: bool = True
) -> str | Path:
    """Gather the sharded checkpoint in directory ``source`` into the single file ``destination``.

    Args:
        source: a directory written by ``FSDPStrategy.save_state`` (sharded; local or remote, e.g.
            ``s3://bucket/run/last.ckpt``) or ``DeepSpeedStrategy.save_state`` (local), or a folder
            holding one (``Accelerator.save_state``'s ``dir``, whose ``dir/state.ckpt`` it is).
        destination: the file to write (its folder is created; local or remote).
        weights_only: read ``source`` safely (tensors, plain values and the known metadata
            classes only). ``False`` unpickles anything, which can run code from the files: only
            for checkpoints from a trusted source.

    Returns:
        ``destination``. It holds the entries given to ``save_state``: modules as full
        ``state_dict()`` s (float32 master weights for DeepSpeed), plain values as saved, and for
        FSDP the optimizer states keyed by parameter name.

    Raises:
        FileNotFoundError/ValueError: see :func:`checkpoint_kind`.
        DamagedCheckpointError: a file of ``source`` is truncated, empty or missing.
        UnsafeCheckpointError: ``source`` holds objects safe loading refuses.
    """
    source = locate_checkpoint(source)
    kind = checkpoint_kind(source)
    if paths.isdir(destination):
        raise ValueError(f"The destination {destination} is a directory; give the path of the file to write.")
    if kind == "fsdp":
        from drivetrain.strategies.fsdp_checkpoint import consolidate_fsdp_checkpoint

        return consolidate_fsdp_checkpoint(source, destination, weights_only=weights_only)
    from drivetrain.strategies.deepspeed_checkpoint import consolidate_deepspeed_checkpoint

    return consolidate_deepspeed_checkpoint(source, destination, weights_only=weights_only)
