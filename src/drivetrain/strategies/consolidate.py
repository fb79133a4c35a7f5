"""Turn a sharded checkpoint (FSDP or DeepSpeed) into one file loadable on a single device.

``consolidate_checkpoint(src, dst)`` (and the command ``drivetrain consolidate SRC DST``) reads
the layout of ``src`` and writes ``dst`` with ``torch.save``, atomically; the result loads with
``torch.load(dst, weights_only=True)`` in one process, without a process group or a GPU.
"""

from __future__ import annotations

from pathlib import Path

from drivetrain._utilities import paths


def checkpoint_kind(path: str | Path) -> str:
    """``"fsdp"`` for a DCP directory, ``"deepspeed"`` for a DeepSpeed engine checkpoint.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        ValueError: it exists but is neither layout.
    """
    if not paths.exists(path):
        raise FileNotFoundError(f"No checkpoint at {path}.")
    from drivetrain.strategies.deepspeed_checkpoint import is_deepspeed_checkpoint
    from drivetrain.strategies.fsdp_checkpoint import is_sharded_checkpoint

    if is_sharded_checkpoint(path):
        return "fsdp"
    if not paths.is_remote(path) and is_deepspeed_checkpoint(Path(path)):
        return "deepspeed"
    raise ValueError(
        f"{path} is not a sharded checkpoint drivetrain knows: expected a directory written by "
        f"FSDPStrategy.save_state (with DCP's .metadata) or by DeepSpeedStrategy.save_state (with a 'latest' "
        f"file or a tag folder holding mp_rank_00_model_states.pt). A single file is already consolidated."
    )


def consolidate_checkpoint(
    source: str | Path, destination: str | Path, *, weights_only: bool = True
) -> str | Path:
    """Gather the sharded checkpoint in directory ``source`` into the single file ``destination``.

    Args:
        source: a directory written by ``FSDPStrategy.save_state`` (sharded; local or remote, e.g.
            ``s3://bucket/run/last.ckpt``) or ``DeepSpeedStrategy.save_state`` (local).
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
    kind = checkpoint_kind(source)
    if paths.isdir(destination):
        raise ValueError(f"The destination {destination} is a directory; give the path of the file to write.")
    if kind == "fsdp":
        from drivetrain.strategies.fsdp_checkpoint import consolidate_fsdp_checkpoint

        return consolidate_fsdp_checkpoint(source, destination, weights_only=weights_only)
    from drivetrain.strategies.deepspeed_checkpoint import consolidate_deepspeed_checkpoint

    return consolidate_deepspeed_checkpoint(source, destination, weights_only=weights_only)
