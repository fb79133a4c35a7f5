"""Paths that may be remote: every path drivetrain accepts goes through here.

A path with a scheme (``s3://bucket/run``, ``gs://…``, ``memory://…``) names remote storage and
is reached through `fsspec <https://filesystem-spec.readthedocs.io>`_; it never becomes a local
folder named after the scheme. A plain path (or ``file://``) stays on the local fast path:
``os`` calls, and fsspec is not even imported.

The functions below take either kind and do the same thing on both, so a caller never asks
which kind it has unless the semantics differ (atomic renames exist only on local disks; see
:mod:`drivetrain.plugins.io.atomic`). ``storage_options`` are fsspec's keyword arguments for the
filesystem (credentials, ``endpoint_url`` …); fsspec also reads them from its configuration and
environment (``FSSPEC_S3_ENDPOINT_URL`` …).
"""

from __future__ import annotations

import os
import posixpath
import re
import shutil
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import IO, TYPE_CHECKING, Any

from drivetrain._utilities.imports import MissingDependencyError

if TYPE_CHECKING:
    from fsspec import AbstractFileSystem

_SCHEME = re.compile(r"^(?P<protocol>[A-Za-z][A-Za-z0-9+.-]*)://")
_LOCAL_PROTOCOLS = ("file", "local")


def _text(path: str | os.PathLike[str], name: str | None = None) -> str:
    """``path`` as a string, or a ``TypeError`` that says what a path may be (not ``os.fspath``'s bare one)."""
    text = path if isinstance(path, str) else os.fspath(path) if isinstance(path, os.PathLike) else None
    if not isinstance(text, str):
        kind = type(path).__name__
        given = (
            f"{name}={path!r} ({kind}) is not a path" if name else f"expected a path, got {kind} ({path!r})"
        )
        raise TypeError(
            f"{given}. Pass a str or a pathlib.Path, such as "
            f"'runs/exp1', or a URL such as 's3://bucket/runs'."
        )
    return text


def protocol(path: str | os.PathLike[str]) -> str | None:
    """The scheme of ``path`` (``"s3"`` for ``s3://bucket/key``), ``None`` for a plain local path."""
    match = _SCHEME.match(_text(path))
    return match["protocol"].lower() if match else None


def is_remote(path: str | os.PathLike[str] | None) -> bool:
    """Whether ``path`` names storage reached through fsspec (a scheme other than ``file://``)."""
    if path is None:
        return False
    scheme = protocol(path)
    return scheme is not None and scheme not in _LOCAL_PROTOCOLS


def normalize(path: str | os.PathLike[str], name: str | None = None) -> str:
    """``path`` as a string: ``file://`` URLs become local paths, remote URLs stay as given.

    ``name`` (the argument's name) makes the error for something that is not a path name it.
    """
    text = _text(path, name)
    scheme = protocol(text)
    if scheme in _LOCAL_PROTOCOLS:
        return text.split("://", 1)[1]
    return text


def join(base: str | os.PathLike[str], *parts: str) -> str:
    """``base/part/…``; a remote base keeps its ``scheme://`` (``pathlib`` would collapse it to ``s3:/``)."""
    text = normalize(base)
    if is_remote(text):
        return posixpath.join(text, *parts)
    return os.path.join(text, *parts)


def parent(path: str | os.PathLike[str]) -> str:
    """The folder that holds ``path``."""
    text = normalize(path).rstrip("/") or "/"
    if is_remote(text):
        scheme, rest = text.split("://", 1)
        head = posixpath.dirname(rest)
        return f"{scheme}://{head}"
    return os.path.dirname(text) or "."


def name(path: str | os.PathLike[str]) -> str:
    """The last component of ``path``."""
    text = normalize(path).rstrip("/")
    return posixpath.basename(text) if is_remote(text) else os.path.basename(text)


def same_folder(a: str | os.PathLike[str], b: str | os.PathLike[str]) -> bool:
    """Whether ``a`` and ``b`` name the same folder (locally after resolving ``..`` and links)."""
    first, second = normalize(a), normalize(b)
    if is_remote(first) or is_remote(second):
        return _remote_key(first) == _remote_key(second)
    return os.path.realpath(first) == os.path.realpath(second)


def is_entry_of(path: str | os.PathLike[str], folder: str | os.PathLike[str]) -> bool:
    """Whether ``path`` names an entry directly inside ``folder``.

    The check made before deleting on anyone's say-so: ``folder/../data``, ``/home/me/x`` or a
    path through a link that leads elsewhere is not an entry of ``folder``. Remote paths with a
    ``..`` component are never entries (object stores take it literally, fsspec may not).
    """
    text = normalize(path)
    entry = name(text)
    if entry in ("", ".", "..") or not text.rstrip("/"):
        return False
    if is_remote(text):
        return ".." not in text.split("://", 1)[1].split("/") and same_folder(parent(text), folder)
    if is_remote(folder):
        return False
    return same_folder(os.path.dirname(os.path.abspath(text)), folder)


def _remote_key(path: str) -> tuple[str, str] | None:
    if not is_remote(path):
        return None
    scheme, rest = path.split("://", 1)
    return scheme.lower(), posixpath.normpath("/" + rest.rstrip("/"))


def filesystem(
    path: str | os.PathLike[str], storage_options: Mapping[str, Any] | None = None
) -> tuple[AbstractFileSystem, str]:
    """The fsspec filesystem for the remote ``path`` and the path as that filesystem names it.

    fsspec caches filesystem instances per protocol and options, so calling this for every
    operation costs a dictionary look-up.

    Raises:
        ValueError: the protocol is unknown to fsspec (the message lists the known ones).
        MissingDependencyError: the package implementing the protocol (``s3fs``, ``gcsfs`` …)
            is not installed; the message names it.
    """
    text = _text(path)
    scheme = protocol(text) or "file"
    try:
        import fsspec
        from fsspec.core import url_to_fs
        from fsspec.registry import known_implementations, registry
    except ImportError:  # a base dependency; only a broken install lacks it
        raise MissingDependencyError(
            f"'{text}' is a remote path, which drivetrain reaches through the 'fsspec' package, and it is not "
            f"installed. Install it with: pip install fsspec"
        ) from None
    if scheme not in registry and scheme not in known_implementations:
        known = sorted(set(fsspec.available_protocols()) - {"file", "local"})
        raise ValueError(
            f"'{text}' names the storage protocol '{scheme}', which fsspec does not know. Use a local path, or one "
            f"of the protocols fsspec knows ({', '.join(known)}), or install the package that registers "
            f"'{scheme}' with fsspec."
        )
    try:
        return url_to_fs(text, **dict(storage_options or {}))
    except ImportError as error:
        package = _package_for(scheme, known_implementations)
        raise MissingDependencyError(
            f"'{text}' is on '{scheme}' storage, which fsspec reaches through the '{package}' package, and it is "
            f"not installed ({error}). Install it with: pip install {package}"
        ) from None


def fresh_filesystem(
    path: str | os.PathLike[str], storage_options: Mapping[str, Any] | None
) -> tuple[AbstractFileSystem, str]:
    """The filesystem with its cached listings of ``path`` dropped: other processes (ranks, runs) write there too."""
    fs, inner = filesystem(path, storage_options)
    fs.invalidate_cache(inner)
    return fs, inner


def _package_for(scheme: str, known: Mapping[str, Any]) -> str:
    spec = known.get(scheme, {})
    target = spec.get("class", "") if isinstance(spec, Mapping) else ""
    return target.split(".", 1)[0] or scheme


def check(path: str | os.PathLike[str] | None, storage_options: Mapping[str, Any] | None = None) -> None:
    """Fail now, with the fix, if ``path`` is remote and its filesystem cannot be reached through fsspec.

    For constructors: a bad ``s3://`` setting is reported where it is given, not at the first save.
    """
    if path is not None and is_remote(path):
        filesystem(path, storage_options)


@contextmanager
def reaching(path: str | os.PathLike[str]) -> Iterator[None]:
    """Turn a remote store's refusal for lack of credentials into an error that says so, and how to fix it.

    Without credentials s3fs raises botocore's ``NoCredentialsError`` from deep inside (and its
    ``isfile`` answers ``False``, so a checkpoint that is there looked missing).
    """
    try:
        yield
    except Exception as error:
        if "Credentials" not in type(error).__name__ and not isinstance(error, PermissionError):
            raise
        text = _text(path)
        lacking = (
            "no credentials were found" if "Credentials" in type(error).__name__ else "access was denied"
        )
        hint = (
            " For S3: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE, an instance role), or "
            "storage_options={'anon': True} for a public bucket."
            if protocol(text) in ("s3", "s3a")
            else ""
        )
        raise PermissionError(
            f"Cannot reach '{text}': {lacking} ({type(error).__name__}: {error}). Give the credentials for "
            f"'{protocol(text)}' storage in the environment or in storage_options.{hint}"
        ) from error


# -- operations on either kind of path ----------------------------------------------------------------
def exists(path: str | os.PathLike[str], storage_options: Mapping[str, Any] | None = None) -> bool:
    if is_remote(path):
        with reaching(path):
            fs, inner = fresh_filesystem(path, storage_options)
            return bool(fs.exists(inner))
    return os.path.exists(normalize(path))


def isdir(path: str | os.PathLike[str], storage_options: Mapping[str, Any] | None = None) -> bool:
    if is_remote(path):
        with reaching(path):
            fs, inner = fresh_filesystem(path, storage_options)
            return bool(fs.isdir(inner))
    return os.path.isdir(normalize(path))


def isfile(path: str | os.PathLike[str], storage_options: Mapping[str, Any] | None = None) -> bool:
    if is_remote(path):
        with reaching(path):
            fs, inner = fresh_filesystem(path, storage_options)
            try:  # not fs.isfile, which answers False when the store refuses the request
                return fs.info(inner).get("type") == "file"
            except FileNotFoundError:
                return False
    return os.path.isfile(normalize(path))


def listdir(path: str | os.PathLike[str], storage_options: Mapping[str, Any] | None = None) -> list[str]:
    """The names in the folder ``path`` (empty when there is none)."""
    if is_remote(path):
        with reaching(path):
            return _listdir_remote(path, storage_options)
    try:
        return os.listdir(normalize(path))
    except OSError:
        return []


def _listdir_remote(path: str | os.PathLike[str], storage_options: Mapping[str, Any] | None) -> list[str]:
    fs, inner = fresh_filesystem(path, storage_options)
    try:
        entries = fs.ls(inner, detail=False, refresh=True)
    except FileNotFoundError:
        return []
    except TypeError:  # a filesystem whose ls takes no refresh
        try:
            entries = fs.ls(inner, detail=False)
        except FileNotFoundError:
            return []
    stripped = inner.rstrip("/")
    return sorted({posixpath.basename(e.rstrip("/")) for e in entries if e.rstrip("/") != stripped})


def makedirs(path: str | os.PathLike[str], storage_options: Mapping[str, Any] | None = None) -> None:
    """Create the folder ``path`` and its parents (object stores have no folders: nothing to do there)."""
    if is_remote(path):
        with reaching(path):
            fs, inner = filesystem(path, storage_options)
            fs.makedirs(inner, exist_ok=True)
        return
    os.makedirs(normalize(path), exist_ok=True)


def open_file(
    path: str | os.PathLike[str],
    mode: str = "rb",
    storage_options: Mapping[str, Any] | None = None,
    **kwargs: Any,
) -> IO[Any]:
    """Open ``path`` (``kwargs`` as for :func:`open`, e.g. ``newline=""``)."""
    if is_remote(path):
        with reaching(path):
            fs, inner = filesystem(path, storage_options)
            return fs.open(inner, mode, **kwargs)
    return open(normalize(path), mode, **kwargs)


def size(path: str | os.PathLike[str], storage_options: Mapping[str, Any] | None = None) -> int:
    if is_remote(path):
        with reaching(path):
            fs, inner = fresh_filesystem(path, storage_options)
            return int(fs.size(inner))
    return os.stat(normalize(path)).st_size


def modified(path: str | os.PathLike[str], storage_options: Mapping[str, Any] | None = None) -> float:
    """When ``path`` was last written, as a POSIX timestamp."""
    if is_remote(path):
        with reaching(path):
            fs, inner = fresh_filesystem(path, storage_options)
            return float(fs.modified(inner).timestamp())
    return os.stat(normalize(path)).st_mtime


def remove_tree(path: str | os.PathLike[str], storage_options: Mapping[str, Any] | None = None) -> None:
    """Delete the file or folder ``path``; nothing there is not an error."""
    if is_remote(path):
        fs, inner = filesystem(path, storage_options)
        try:
            fs.rm(inner, recursive=True)
        except FileNotFoundError:
            pass
        return
    local = normalize(path)
    if os.path.isdir(local) and not os.path.islink(local):
        shutil.rmtree(local, ignore_errors=True)
    else:
        try:
            os.unlink(local)
        except FileNotFoundError:
            pass
