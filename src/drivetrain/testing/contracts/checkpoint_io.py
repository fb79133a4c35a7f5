"""The checkpoint IO's contract: what is saved comes back whole, and a crash during a save loses nothing.

The crash check kills a forked process at chosen file-system calls of a ``save_checkpoint`` that
replaces an existing checkpoint (each ``write`` of a file opened for writing under the folder,
``fsync``, ``rename``/``replace``, ``mkdir``, ``unlink``): afterwards ``load_checkpoint`` must
return the old checkpoint or the new one, complete, never half of one. That is what lets a run
killed while saving resume from the last complete checkpoint.
"""

from __future__ import annotations

import builtins
import io
import os
import shutil
import signal
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from drivetrain.plugins import CheckpointIO
from drivetrain.testing.contracts import Check, NotApplicable, same


def sample_checkpoint(version: int) -> dict[str, Any]:
    """A checkpoint shaped like the ones drivetrain writes (weights, optimizer, loops, generators, extras)."""
    generator = torch.Generator().manual_seed(version)
    return {
        "state_dict": {
            "net.0.weight": torch.randn(96, 64, generator=generator),
            "net.0.bias": torch.zeros(96, dtype=torch.float64),
            "net.1.num_batches_tracked": torch.tensor(version),
            "net.2.weight": torch.randn(4, 96, generator=generator).to(torch.bfloat16),
        },
        "optimizer_states": [
            {
                "state": {0: {"momentum_buffer": torch.randn(96, 64, generator=generator)}},
                "param_groups": [{"lr": 0.05, "momentum": 0.9, "params": [0]}],
            }
        ],
        "lr_schedulers": [{"last_epoch": version, "_last_lr": [0.05]}],
        "epoch": version,
        "global_step": 10 * version,
        "loops": {"fit_loop": {"batch": 3, "done": False}},
        "rng": {"torch": torch.get_rng_state(), "python": [3, list(range(8)), None]},
        "hyper_parameters": {"name": "kit", "flag": True, "ratio": 0.5, "layers": (64, 96)},
        "callbacks": {"ModelCheckpoint{'monitor': None}": {"best_model_path": "", "kth_value": None}},
        "precision": {"scaler": {"scale": 65536.0, "_growth_tracker": 2}},
        "drivetrain_version": "kit",
    }


def checkpoint_io_checks(cls: Any, make: Callable[[], Any], folder: str | None) -> list[Check]:
    """The checks for checkpoint IO class ``cls``; ``make()`` builds one; ``folder`` is where to write (a URL for remote)."""
    local = folder is None or "://" not in folder
    root = Path(folder) if folder and local else None
    state: dict[str, Any] = {}

    def place(name: str) -> str:
        if not local:
            return f"{str(folder).rstrip('/')}/{name}"
        if root is None and "tmp" not in state:  # one folder, made on first use (teardown removes it)
            state["tmp"] = tempfile.mkdtemp(prefix="drivetrain-kit-io-")
        base = root if root is not None else Path(state["tmp"])
        return str(base / name / "last.ckpt")

    def subclass() -> str | None:
        if not (isinstance(cls, type) and issubclass(cls, CheckpointIO)):
            return f"{cls!r} is not a subclass of drivetrain.plugins.CheckpointIO"
        state["io"] = make()
        return None

    def round_trip() -> str | None:
        path, written = place("round-trip"), sample_checkpoint(1)
        state["io"].save_checkpoint(written, path)
        loaded = state["io"].load_checkpoint(path)
        return _difference(written, loaded)

    def overwrite() -> str | None:
        path = place("overwrite")
        state["io"].save_checkpoint(sample_checkpoint(1), path)
        state["io"].save_checkpoint(sample_checkpoint(2), path)
        loaded = state["io"].load_checkpoint(path)
        if not isinstance(loaded, dict) or loaded.get("global_step") != 20:
            return "saving a second checkpoint to the same path and loading it did not give the second one"
        return None

    def crash_during_save() -> str | NotApplicable | None:
        if not local:
            return NotApplicable("a crash is simulated on local file systems only")
        return _crash_sweep(make, Path(place("crash")))

    def missing() -> str | None:
        path = place("nothing-here")
        try:
            found = state["io"].load_checkpoint(path)
        except (FileNotFoundError, OSError, ValueError, KeyError):
            return None
        return f"load_checkpoint() of a path where nothing was saved returned {type(found).__name__} instead of raising FileNotFoundError"

    def remove() -> str | None:
        path = place("remove")
        state["io"].save_checkpoint(sample_checkpoint(1), path)
        state["io"].remove_checkpoint(path)
        try:
            state["io"].load_checkpoint(path)
        except (FileNotFoundError, OSError, ValueError, KeyError):
            return None
        return "after remove_checkpoint(path), load_checkpoint(path) still returned a checkpoint"

    def teardown() -> str | None:
        state["io"].teardown()
        if "tmp" in state:
            shutil.rmtree(state["tmp"], ignore_errors=True)
        return None

    return [
        Check(
            "checkpoint IO: subclasses CheckpointIO",
            subclass,
            "subclass drivetrain.plugins.CheckpointIO (save_checkpoint, load_checkpoint, remove_checkpoint)",
            essential=True,
        ),
        Check(
            "checkpoint IO: load_checkpoint returns what save_checkpoint wrote",
            round_trip,
            "write and read every key and value unchanged (tensors with their dtype, nested dicts and lists, numbers, strings, None)",
        ),
        Check(
            "checkpoint IO: a second save to a path replaces the first",
            overwrite,
            "replace what is at the path",
        ),
        Check(
            "checkpoint IO: a crash during save leaves the old or the new checkpoint",
            crash_during_save,
            "write to a temporary file next to the target and rename it over the target only when complete (os.replace), as TorchCheckpointIO does",
        ),
        Check(
            "checkpoint IO: loading where nothing was saved is an error",
            missing,
            "raise FileNotFoundError naming the path",
        ),
        Check(
            "checkpoint IO: remove_checkpoint removes it",
            remove,
            "delete what save_checkpoint wrote at the path",
        ),
        Check(
            "checkpoint IO: teardown() runs", teardown, "finish pending writes in teardown() without raising"
        ),
    ]


def _difference(written: dict[str, Any], loaded: Any) -> str | None:
    if not isinstance(loaded, dict):
        return f"load_checkpoint() returned {type(loaded).__name__}, not the dict that was saved"
    missing = sorted(set(written) - set(loaded))
    if missing:
        return f"the loaded checkpoint lacks the key(s) {', '.join(map(repr, missing))}"
    changed = [key for key in written if not same(written[key], loaded[key])]
    if changed:
        return f"the loaded checkpoint's {', '.join(map(repr, changed))} differ from what was saved (values or dtypes)"
    return None


# -- a crash at the N-th file-system call of a save, in a forked child ---------------------------------
def _crash_sweep(make: Callable[[], Any], path: Path) -> str | None:
    # What an undisturbed save of each version reads back as: the round trip is checked on its own above.
    versions = []
    for version in (1, 2):
        clean = path.parent.parent / f"{path.parent.name}-clean-{version}" / path.name
        make().save_checkpoint(sample_checkpoint(version), str(clean))
        versions.append(make().load_checkpoint(str(clean)))
    events = _save_in_child(make, path, kill_at=None)
    if isinstance(events, str):
        return events
    if events == 0:
        return f"save_checkpoint() made no file-system call under {path.parent} (did it write anywhere?)"
    points = sorted({1, max(1, events // 2), max(1, events - 1), events})
    for kill_at in points:
        outcome = _save_in_child(make, path, kill_at=kill_at)
        if isinstance(outcome, str):
            return outcome
        try:
            loaded = make().load_checkpoint(str(path))
        except Exception as error:
            return (
                f"a process killed at file-system call {kill_at} of {events} of save_checkpoint() left a checkpoint "
                f"that load_checkpoint() cannot read ({type(error).__name__}: {str(error)[:200]})"
            )
        if not (same(loaded, versions[0]) or same(loaded, versions[1])):
            return (
                f"a process killed at file-system call {kill_at} of {events} of save_checkpoint() left a checkpoint "
                f"that is neither the old one nor the new one"
            )
    return None


def _save_in_child(make: Callable[[], Any], path: Path, kill_at: int | None) -> int | str:
    """Save version 1, then version 2 in a forked child killed at its ``kill_at``-th event; the events counted."""
    if path.parent.exists():
        shutil.rmtree(path.parent)
    make().save_checkpoint(sample_checkpoint(1), str(path))
    reader, writer = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: count (and maybe die at) each file-system call of one save
        os.close(reader)
        code = 0
        try:
            counter = _install_kill_points(str(path.parent), kill_at)
            make().save_checkpoint(sample_checkpoint(2), str(path))
            os.write(writer, str(counter[0]).encode())
        except BaseException as error:
            os.write(writer, f"error:{type(error).__name__}: {error}".encode())
            code = 1
        finally:
            os._exit(code)
    os.close(writer)
    _, status = os.waitpid(pid, 0)
    with os.fdopen(reader) as pipe:
        message = pipe.read()
    if message.startswith("error:"):
        return f"save_checkpoint() over an existing checkpoint raised {message[6:]}"
    if kill_at is not None:
        return kill_at
    if not message:
        return f"the save ended with status {status} without reporting"
    return int(message)


def _install_kill_points(root: str, kill_at: int | None) -> list[int]:
    counter = [0]
    root = os.path.abspath(root)

    def event(target: Any) -> None:
        where = _where(target)
        if where is not None and (where == root or where.startswith(root + os.sep)):
            counter[0] += 1
            if counter[0] == kill_at:
                os.kill(os.getpid(), signal.SIGKILL)

    real_open = builtins.open

    class Writer:
        def __init__(self, handle: Any, name: Any) -> None:
            self._handle, self._name = handle, name

        def write(self, data: Any) -> int:
            event(self._name)
            return self._handle.write(data)

        def __enter__(self) -> Any:
            return self

        def __exit__(self, *exc: Any) -> None:
            self._handle.close()

        def __getattr__(self, name: str) -> Any:
            return getattr(self._handle, name)

    def open_(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        handle = real_open(file, mode, *args, **kwargs)
        if any(flag in mode for flag in "wxa+"):
            event(file)
            return Writer(handle, file)
        return handle

    builtins.open = open_
    io.open = open_

    def counted(real: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            event(args[0] if args else "")
            return real(*args, **kwargs)

        return call

    for name in ("fsync", "rename", "replace", "mkdir", "unlink", "remove", "rmdir"):
        setattr(os, name, counted(getattr(os, name)))
    real_save = torch.save

    def save(obj: Any, f: Any, *args: Any, **kwargs: Any) -> None:
        if isinstance(f, (str, os.PathLike)):  # through Python's file object, chunk by chunk
            with open_(f, "wb") as file:
                real_save(obj, file, *args, **kwargs)
            return
        real_save(obj, f, *args, **kwargs)

    torch.save = save
    return counter


def _where(target: Any) -> str | None:
    if isinstance(target, int):
        try:
            return os.readlink(f"/proc/self/fd/{target}")
        except OSError:
            return None
    if isinstance(target, (str, bytes, os.PathLike)):
        return os.path.abspath(os.fsdecode(target))
    return None
