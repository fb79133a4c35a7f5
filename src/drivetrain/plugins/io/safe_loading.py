"""Reading checkpoints without running code from them, and telling a damaged file from a refused one.

Every loader in drivetrain goes through this module:

* files written by ``torch.save`` are checked for structure (a complete zip archive, or torch's
  legacy format) and read with ``torch.load(weights_only=True)``: tensors, containers, plain
  values and the classes allowed with ``torch.serialization.add_safe_globals``;
* the metadata of a ``torch.distributed.checkpoint`` (DCP) folder, which torch reads with plain
  ``pickle.load``, is read by an allow-list unpickler that knows DCP's metadata classes and
  nothing else (:func:`load_dcp_metadata`, used by :mod:`drivetrain.plugins.io.dcp`'s reader);
  DCP's non-tensor entries, which torch reads with ``weights_only=False``, are first proven
  harmless with ``weights_only=True`` (:func:`check_pickled_bytes`);
* third-party loaders that hard-code ``weights_only=False`` (DeepSpeed) run inside
  :func:`forced_weights_only`, which makes every ``torch.load`` in them safe.

Two failures are told apart. :class:`DamagedCheckpointError`: the file is empty, truncated or
not a checkpoint at all; safe loading has nothing to do with it and the message says so.
:class:`UnsafeCheckpointError`: a sound file holds objects safe loading refuses; the message
names them and the explicit opt-out of the entry point that was used.
"""

from __future__ import annotations

import dataclasses
import enum
import importlib
import io
import os
import pickle
import zipfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from drivetrain._utilities import paths

#: The opt-out named in refusals raised below the front doors (each door names its own).
DEFAULT_OPT_OUT = "weights_only=False"
# torch.save's legacy (pre-zip) format starts with this pickled magic number (protocol 2).
_LEGACY_MAGIC = pickle.dumps(0x1950A86A20F9469CFC6C, protocol=2)
_FORCE = "TORCH_FORCE_WEIGHTS_ONLY_LOAD"
_FORCE_NO = "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"


class DamagedCheckpointError(ValueError):
    """The file is empty, truncated, corrupt or not a checkpoint (nothing to do with safe loading)."""

    def __init__(self, path: str | os.PathLike[str], detail: str) -> None:
        self.path = os.fspath(path)
        self.detail = detail
        super().__init__(
            f"The checkpoint '{self.path}' is damaged or not a checkpoint: {detail}. A crash while it was "
            f"written, a copy that did not finish, or a path naming some other file leaves this; load an "
            f"intact checkpoint (resuming from 'last' or the newest automatic checkpoint skips damaged ones)."
        )

    def __reduce__(self) -> Any:  # errors travel between ranks pickled
        return type(self), (self.path, self.detail)


class UnsafeCheckpointError(pickle.UnpicklingError):
    """A sound checkpoint holds objects that safe (``weights_only``) loading refuses to build."""

    def __init__(self, path: str | os.PathLike[str], refused: str, opt_out: str = DEFAULT_OPT_OUT) -> None:
        self.path = os.fspath(path)
        self.refused = refused
        self.opt_out = opt_out
        super().__init__(
            f"The checkpoint '{self.path}' holds objects that safe loading refuses: {refused}. Building them "
            f"could run arbitrary code from the file. If you trust the classes it names, allow them with "
            f"torch.serialization.add_safe_globals([...]) before loading; if you trust the whole file, load it "
            f"with {opt_out} (unpickling can then run any code the file contains)."
        )

    def __reduce__(self) -> Any:
        return type(self), (self.path, self.refused, self.opt_out)

    def with_opt_out(self, opt_out: str) -> UnsafeCheckpointError:
        """The same refusal, naming the opt-out of the entry point the user called."""
        return UnsafeCheckpointError(self.path, self.refused, opt_out)


# -- files written by torch.save ---------------------------------------------------------------
def check_torch_file(path: str | os.PathLike[str], storage_options: Any | None = None) -> None:
    """Raise :class:`DamagedCheckpointError` unless ``path`` is a structurally complete ``torch.save`` file.

    Cheap: reads the zip archive's index (written last, so a truncated file has none), not the data.
    Local or remote (a remote file is read by range requests; ``storage_options`` configure its
    filesystem).
    """
    size = paths.size(path, storage_options)
    if size == 0:
        raise DamagedCheckpointError(path, "the file is empty")
    with paths.open_file(path, "rb", storage_options) as file:
        if zipfile.is_zipfile(file):
            try:
                with zipfile.ZipFile(file) as archive:
                    entries = archive.infolist()
            except (zipfile.BadZipFile, OSError, ValueError) as error:
                raise DamagedCheckpointError(path, f"its zip index cannot be read ({error})") from None
            if not any(entry.filename.rsplit("/", 1)[-1] == "data.pkl" for entry in entries):
                raise DamagedCheckpointError(path, "it is a zip archive, but not one torch.save wrote")
            if any(entry.header_offset + entry.compress_size > size for entry in entries):
                raise DamagedCheckpointError(
                    path, "its zip index points past the end of the file (truncated)"
                )
            return
        file.seek(0)
        head = file.read(len(_LEGACY_MAGIC))
    if head != _LEGACY_MAGIC:
        raise DamagedCheckpointError(
            path,
            f"it is neither a torch.save archive nor a legacy torch file ({size} bytes, truncated or other data)",
        )


def load_torch_file(
    path: str | os.PathLike[str], map_location: Any | None = None, *, weights_only: bool = True
) -> Any:
    """``torch.load`` of a checkpoint file, safe unless ``weights_only=False``, with errors that say what is wrong.

    Raises:
        FileNotFoundError: nothing at ``path``.
        IsADirectoryError: ``path`` is a folder (a sharded checkpoint).
        DamagedCheckpointError: the file is empty, truncated or not a checkpoint.
        UnsafeCheckpointError: the file holds objects ``weights_only`` loading refuses.
    """
    if paths.is_remote(path):
        shown = os.fspath(path)
        if not paths.exists(path):
            raise FileNotFoundError(f"No checkpoint at '{shown}'.")
        if paths.isdir(path):
            raise IsADirectoryError(
                f"'{shown}' is a folder (a sharded checkpoint), not a checkpoint file: load it through the strategy "
                f"that wrote it, or consolidate it into one file with `drivetrain consolidate`."
            )
        check_torch_file(path)
        with paths.open_file(path, "rb") as file:
            return _load(file, shown, map_location, weights_only)
    path = Path(paths.normalize(path))
    if not path.exists():
        raise FileNotFoundError(f"No checkpoint at '{path}' (resolved to '{path.resolve()}').")
    if path.is_dir():
        raise IsADirectoryError(
            f"'{path}' is a folder (a sharded checkpoint), not a checkpoint file: load it through the strategy "
            f"that wrote it, or consolidate it into one file with `drivetrain consolidate`."
        )
    check_torch_file(path)
    return _load(path, path, map_location, weights_only)


def _load(source: Any, path: str | os.PathLike[str], map_location: Any, weights_only: bool) -> Any:
    try:
        return torch.load(source, map_location=map_location, weights_only=weights_only)
    except pickle.UnpicklingError as error:
        if weights_only and is_refusal(error):
            raise UnsafeCheckpointError(path, refusal_reason(error)) from None
        raise DamagedCheckpointError(path, f"its contents cannot be read ({_first_line(error)})") from None
    except (EOFError, zipfile.BadZipFile) as error:
        raise DamagedCheckpointError(path, f"its contents end early ({_first_line(error)})") from None
    except RuntimeError as error:
        if _is_read_failure(error):
            raise DamagedCheckpointError(
                path, f"its contents cannot be read ({_first_line(error)})"
            ) from None
        raise


def is_refusal(error: BaseException) -> bool:
    """Whether ``error`` is torch's weights-only unpickler refusing an object (not a corrupt stream)."""
    text = str(error).lower()
    return any(
        phrase in text
        for phrase in (
            "unsupported global",  # also torch 2.13's "unsupported GLOBAL posix.system whose module posix is blocked"
            "allowed global",
            "allowlisted",
            "unrecognized function",
            "unsupported class",
            "is blocked",
        )
    )


def refusal_reason(error: BaseException) -> str:
    """torch's diagnosis of a refusal without its advice to call ``torch.load`` differently."""
    for line in str(error).splitlines():
        if "WeightsUnpickler error:" in line:
            return line.split("WeightsUnpickler error:", 1)[1].strip()
    return _first_line(error)


def _is_read_failure(error: RuntimeError) -> bool:
    text = str(error)
    return any(
        phrase in text
        for phrase in (
            "PytorchStreamReader",
            "central directory",
            "unexpected EOF",
            "invalid header",
            "archive",
        )
    )


def _first_line(error: BaseException) -> str:
    """The diagnosis in ``error``'s message, without torch's advice about ``weights_only``."""
    for line in str(error).splitlines():
        if "WeightsUnpickler error:" in line:
            return line.split("WeightsUnpickler error:", 1)[1].strip()[:300]
    lines = [line.strip() for line in str(error).splitlines() if line.strip() and "weights_only" not in line]
    return (lines[0] if lines else type(error).__name__)[:300]


@contextmanager
def forced_weights_only(allowed: Sequence[Any] = ()) -> Iterator[None]:
    """Make every ``torch.load`` in this process safe while the context is open, allowing ``allowed`` classes.

    For third-party loaders that pass ``weights_only=False`` themselves (DeepSpeed's engine and
    ``zero_to_fp32``): torch's own switch ``TORCH_FORCE_WEIGHTS_ONLY_LOAD`` overrides the argument
    in every call, however deep, without patching the library.
    """
    saved = {name: os.environ.get(name) for name in (_FORCE, _FORCE_NO)}
    os.environ[_FORCE] = "1"
    os.environ.pop(_FORCE_NO, None)  # both set is an error in torch; ours is the explicit request
    try:
        with torch.serialization.safe_globals(list(allowed)):
            yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


# -- torch.distributed.checkpoint ------------------------------------------------------------------
# DCP's metadata pickles instances of these modules' dataclasses and enums (Metadata, the storage
# descriptions, chunk offsets, _StorageInfo); nothing in them runs code when built.
_DCP_MODULES = (
    "torch.distributed.checkpoint.metadata",
    "torch.distributed.checkpoint.filesystem",
    "torch.distributed.checkpoint.planner",
)
_DCP_EXTRA = {
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),  # maps a layout's name to torch.strided etc.
    ("collections", "OrderedDict"),
    ("builtins", "set"),
    ("builtins", "frozenset"),
    ("pathlib", "PosixPath"),
    ("pathlib", "WindowsPath"),
    ("pathlib", "PurePosixPath"),
    ("pathlib", "PureWindowsPath"),
}


def _allowed_dcp_global(module: str, name: str) -> Any | None:
    if (module, name) in _DCP_EXTRA:
        return getattr(importlib.import_module(module), name)
    if module == "torch":
        value = getattr(torch, name, None)
        return value if isinstance(value, (torch.dtype, torch.layout, torch.memory_format)) else None
    if module in _DCP_MODULES:
        value = getattr(importlib.import_module(module), name, None)
        if isinstance(value, type) and (dataclasses.is_dataclass(value) or issubclass(value, enum.Enum)):
            return value
        return None
    for entry in torch.serialization.get_safe_globals():  # what the user allowed for torch.load too
        allowed, qualified = entry if isinstance(entry, tuple) else (entry, None)
        if qualified is None:
            qualified = f"{getattr(allowed, '__module__', '')}.{getattr(allowed, '__qualname__', '')}"
        if qualified == f"{module}.{name}":
            return allowed
    return None


class _MetadataUnpickler(pickle.Unpickler):
    def __init__(self, file: Any, path: str) -> None:
        super().__init__(file)
        self._path = path

    def find_class(self, module: str, name: str) -> Any:
        allowed = _allowed_dcp_global(module, name)
        if allowed is None:
            raise UnsafeCheckpointError(
                self._path, f"{module}.{name}, which no torch.distributed.checkpoint metadata holds"
            )
        return allowed


def load_dcp_metadata(stream: Any, path: str | os.PathLike[str]) -> Any:
    """Unpickle DCP metadata from ``stream`` with the allow-list (``path`` names it in errors)."""
    from torch.distributed.checkpoint.metadata import Metadata

    shown = os.fspath(path)
    try:
        metadata = _MetadataUnpickler(stream, shown).load()
    except UnsafeCheckpointError:
        raise
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, IndexError) as error:
        raise DamagedCheckpointError(shown, f"its metadata cannot be read ({_first_line(error)})") from None
    if not isinstance(metadata, Metadata):
        raise DamagedCheckpointError(shown, f"it holds a {type(metadata).__name__}, not DCP metadata")
    return metadata


def read_dcp_metadata(folder: str | os.PathLike[str]) -> Any:
    """Read and check a DCP folder's ``.metadata``: safe to unpickle, and every data file it names is whole.

    Raises:
        FileNotFoundError: no ``.metadata`` in ``folder``.
        DamagedCheckpointError: the metadata is unreadable, or a data file is missing or short.
        UnsafeCheckpointError: the metadata references a class DCP metadata never holds.
    """
    metadata_file = paths.join(folder, ".metadata")
    if not paths.isfile(metadata_file):
        raise FileNotFoundError(
            f"'{os.fspath(folder)}' has no .metadata: it is not a torch.distributed.checkpoint folder."
        )
    with paths.open_file(metadata_file, "rb") as stream:
        metadata = load_dcp_metadata(stream, metadata_file)
    needed: dict[str, int] = {}
    for info in (metadata.storage_data or {}).values():
        relative = getattr(info, "relative_path", None)
        if not isinstance(relative, str) or os.path.isabs(relative) or ".." in Path(relative).parts:
            raise DamagedCheckpointError(
                metadata_file, f"it names a data file outside the folder ({relative!r})"
            )
        end = int(getattr(info, "offset", 0)) + int(getattr(info, "length", 0))
        needed[relative] = max(needed.get(relative, 0), end)
    for relative, end in sorted(needed.items()):
        data_file = paths.join(folder, relative)
        if not paths.isfile(data_file):
            raise DamagedCheckpointError(folder, f"the data file '{relative}' its metadata names is missing")
        if paths.size(data_file) < end:
            raise DamagedCheckpointError(data_file, f"it is shorter than its metadata says ({end} bytes)")
    return metadata


def check_pickled_bytes(value: io.BytesIO, where: str) -> None:
    """Raise unless ``value`` (a DCP non-tensor entry) loads with ``weights_only=True``; rewinds it."""
    position = value.tell()
    try:
        torch.load(value, weights_only=True)
    except pickle.UnpicklingError as error:
        if is_refusal(error):
            raise UnsafeCheckpointError(where, refusal_reason(error)) from None
        raise DamagedCheckpointError(where, f"an entry cannot be read ({_first_line(error)})") from None
    except (EOFError, RuntimeError) as error:
        raise DamagedCheckpointError(where, f"an entry cannot be read ({_first_line(error)})") from None
    finally:
        value.seek(position)
