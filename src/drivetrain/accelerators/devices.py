"""Parsing of the user's ``devices`` value, shared by the built-in accelerators.

Accepted forms: ``"auto"``, a positive int ``N`` (the first N devices), ``-1`` (all devices),
numeric strings (``"2"``, ``"-1"``), comma lists (``"0,1"``, ``"0, 1,"``) and lists or tuples of
indices (``[0, 1]``). :func:`normalize_devices` checks the form without knowing how many devices
exist; :func:`parse_device_indices` turns a value into device indices for GPU-like hardware and
:func:`parse_process_count` into a process count for the CPU. Every rejected value is a
``ValueError`` or ``TypeError`` naming the value, what is allowed and how to fix it.
"""

from __future__ import annotations

import numbers
from typing import Any, Literal, Union

DeviceRequest = Union[Literal["auto"], int, list[int]]
"""``"auto"``, a count (a positive int, or -1 for all devices), or explicit device indices."""

ALLOWED_DEVICES = (
    "'auto', a positive int N (the first N devices), -1 (all devices), "
    "or device indices such as [0, 1] or '0,1'"
)
ALLOWED_PROCESSES = "'auto' (one process) or a positive int N (N processes), also as a string such as '2'"


def normalize_devices(
    devices: Any, *, accelerator: str, allowed: str = ALLOWED_DEVICES, by_index: bool = True
) -> DeviceRequest:
    """Check the form of a ``devices`` value and bring it to one canonical shape.

    Args:
        devices: the value the user gave.
        accelerator: the accelerator's short name, for messages.
        allowed: what the caller accepts, for messages.
        by_index: whether the caller picks devices by index (only changes the advice in messages).

    Returns:
        ``"auto"``; an int count (positive, or -1 for all devices) for ints and numeric strings;
        or a list of distinct non-negative indices for lists, tuples and comma lists, in the
        order given.

    Raises:
        TypeError: for bools, floats and types that are not int, str, list or tuple.
        ValueError: for 0, negative counts other than -1, unparsable strings, empty lists,
            negative or repeated indices.
    """
    where = f"devices={devices!r} is not valid for accelerator={accelerator!r}"
    if isinstance(devices, bool):
        raise TypeError(
            f"{where}: a bool does not say how many devices to use. Allowed: {allowed}. "
            f"Pass devices=1 for one device or devices=-1 for all of them."
        )
    if isinstance(devices, float):
        raise TypeError(f"{where}: it is a float. Allowed: {allowed}. Pass an int such as devices=2.")
    if isinstance(devices, numbers.Integral):
        return _check_count(int(devices), where, allowed, by_index)
    if isinstance(devices, str):
        return _normalize_string(devices, where, allowed, by_index)
    if isinstance(devices, (list, tuple)):
        return _check_indices(list(devices), where, allowed)
    raise TypeError(
        f"{where}: expected an int, a str, or a list of ints, got {type(devices).__name__}. "
        f"Allowed: {allowed}. Pass e.g. devices='auto' or devices=1."
    )


def parse_device_indices(devices: Any, *, visible: int, accelerator: str) -> list[int]:
    """Turn ``devices`` into the indices of the devices to use, checked against what is visible.

    ``N`` (or ``"N"``) means the first N devices, ``-1`` and ``"auto"`` all of them, and a list or
    comma list exactly those indices, in the order given.

    Args:
        devices: the value the user gave.
        visible: how many devices of this kind this process can see.
        accelerator: the accelerator's short name, for messages.

    Raises:
        TypeError, ValueError: see :func:`normalize_devices`; also when more devices or a higher
            index are requested than are visible.
    """
    request = normalize_devices(devices, accelerator=accelerator)
    if isinstance(request, list):
        too_high = [index for index in request if index >= visible]
        if too_high:
            seen = f"indices 0..{visible - 1}" if visible > 0 else "none"
            raise ValueError(
                f"devices={devices!r} asks for {accelerator} device {too_high[0]}, but only {visible} "
                f"{accelerator} device(s) are visible here ({seen}). Pick indices below {visible}, "
                f"or check which devices this process is allowed to see."
            )
        return request
    if visible <= 0:
        raise ValueError(
            f"devices={devices!r} asks for {accelerator} devices, but none are visible here. "
            f"Use another accelerator (accelerator='cpu' or 'auto'), or check which devices this "
            f"process is allowed to see."
        )
    if request == "auto" or request == -1:
        return list(range(visible))
    if request > visible:
        raise ValueError(
            f"devices={devices!r} asks for {request} {accelerator} devices, but only {visible} are "
            f"visible here. Use devices={visible} or fewer, or devices=-1 for all of them."
        )
    return list(range(request))


def parse_process_count(devices: Any, *, accelerator: str = "cpu") -> int:
    """Turn ``devices`` into a number of processes (for hardware where devices are not indexed).

    Args:
        devices: the value the user gave: ``"auto"`` (one process) or a positive int or numeric string.
        accelerator: the accelerator's short name, for messages.

    Raises:
        TypeError, ValueError: for -1, device indices and everything :func:`normalize_devices` rejects.
    """
    meaning = f"for accelerator={accelerator!r}, `devices` is the number of processes to start"
    if isinstance(devices, (list, tuple)) or (isinstance(devices, str) and "," in devices):
        raise ValueError(
            f"devices={devices!r} lists device indices, but {meaning}; there are no indices to pick. "
            f"Allowed: {ALLOWED_PROCESSES}. Pass devices=2 to run two processes."
        )
    request = normalize_devices(devices, accelerator=accelerator, allowed=ALLOWED_PROCESSES, by_index=False)
    if request == "auto":
        return 1
    assert isinstance(request, int)
    if request == -1:
        raise ValueError(
            f"devices={devices!r} means 'all devices' on GPUs, but {meaning}, so -1 has no meaning "
            f"here. Allowed: {ALLOWED_PROCESSES}. Pass the number of processes, e.g. devices=2."
        )
    return request


def _check_count(count: int, where: str, allowed: str, by_index: bool) -> int:
    if count == 0:
        fix = "Pass devices=1 or more."
        if by_index:
            fix = "Pass devices=1 or more, or [0] or '0,' to pick the device with index 0."
        raise ValueError(f"{where}: 0 selects no device. Allowed: {allowed}. {fix}")
    if count < -1:
        raise ValueError(
            f"{where}: the only negative value allowed is -1 (all devices). Allowed: {allowed}. "
            f"Pass devices=-1 for all devices or a positive count."
        )
    return count


def _normalize_string(text: str, where: str, allowed: str, by_index: bool) -> DeviceRequest:
    stripped = text.strip()
    if stripped.lower() == "auto":
        return "auto"
    if "," in stripped:
        # A trailing comma ("0,") is how a single index is told apart from a count ("0").
        parts = [part.strip() for part in stripped.split(",")]
        parts = [part for part in parts if part]
        if not parts:
            raise ValueError(f"{where}: the comma list names no index. Allowed: {allowed}. Pass e.g. '0,1'.")
        indices: list[Any] = []
        for part in parts:
            try:
                indices.append(int(part))
            except ValueError:
                raise ValueError(
                    f"{where}: {part!r} in the comma list is not an integer index. Allowed: {allowed}. "
                    f"Pass indices such as '0,1'."
                ) from None
        return _check_indices(indices, where, allowed)
    try:
        count = int(stripped)
    except ValueError:
        raise ValueError(
            f"{where}: the string is not 'auto', an integer or a comma-separated list of indices. "
            f"Allowed: {allowed}. Pass e.g. devices=2 or devices='0,1'."
        ) from None
    return _check_count(count, where, allowed, by_index)


def _check_indices(indices: list[Any], where: str, allowed: str) -> list[int]:
    if not indices:
        raise ValueError(
            f"{where}: an empty list selects no device. Allowed: {allowed}. "
            f"Pass at least one index, e.g. [0]."
        )
    checked: list[int] = []
    for index in indices:
        if isinstance(index, bool) or not isinstance(index, numbers.Integral):
            raise TypeError(
                f"{where}: every device index must be an int, got {index!r} ({type(index).__name__}). "
                f"Allowed: {allowed}. Pass indices such as [0, 1]."
            )
        if index < 0:
            raise ValueError(
                f"{where}: device indices must be 0 or more, got {index}. Allowed: {allowed}. "
                f"To use all devices pass devices=-1 on its own."
            )
        if int(index) in checked:
            raise ValueError(
                f"{where}: device {index} is listed more than once. Allowed: {allowed}. "
                f"List each index once, e.g. [0, 1]."
            )
        checked.append(int(index))
    return checked
