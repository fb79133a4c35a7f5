"""Parsing of the ``devices`` value: every accepted form and every rejected one, with its message."""

from __future__ import annotations

import re
from typing import Any

import pytest

from drivetrain.accelerators.devices import normalize_devices, parse_device_indices, parse_process_count


@pytest.mark.parametrize(
    ("devices", "expected"),
    [
        ("auto", [0, 1, 2, 3]),
        (" AUTO ", [0, 1, 2, 3]),
        (1, [0]),
        (2, [0, 1]),
        (4, [0, 1, 2, 3]),
        (-1, [0, 1, 2, 3]),
        ("2", [0, 1]),
        ("-1", [0, 1, 2, 3]),
        ("0,", [0]),
        ("3,", [3]),
        ("0,1", [0, 1]),
        ("0, 1,", [0, 1]),
        (" 2 , 0 ", [2, 0]),
        ([0, 1], [0, 1]),
        ([3, 1], [3, 1]),
        ((2,), [2]),
        ([0], [0]),
    ],
)
def test_accepted_values(devices: Any, expected: list[int]) -> None:
    assert parse_device_indices(devices, visible=4, accelerator="cuda") == expected


def test_count_and_indices_differ() -> None:
    # "N" and N are counts (the first N devices); a list or trailing comma names indices.
    assert parse_device_indices("2", visible=4, accelerator="cuda") == [0, 1]
    assert parse_device_indices("2,", visible=4, accelerator="cuda") == [2]
    assert parse_device_indices([2], visible=4, accelerator="cuda") == [2]


def test_normalize_keeps_the_shape() -> None:
    assert normalize_devices("auto", accelerator="cuda") == "auto"
    assert normalize_devices("3", accelerator="cuda") == 3
    assert normalize_devices(-1, accelerator="cuda") == -1
    assert normalize_devices("1,0", accelerator="cuda") == [1, 0]


ALLOWED = re.escape(
    "Allowed: 'auto', a positive int N (the first N devices), -1 (all devices), "
    "or device indices such as [0, 1] or '0,1'."
)


@pytest.mark.parametrize(
    ("devices", "error", "message"),
    [
        (
            0,
            ValueError,
            r"devices=0 is not valid for accelerator='cuda': 0 selects no device\. "
            + ALLOWED
            + r" Pass devices=1 or more, or \[0\] or '0,' to pick the device with index 0\.",
        ),
        ("0", ValueError, r"devices='0' is not valid .*0 selects no device"),
        (
            -2,
            ValueError,
            r"devices=-2 is not valid for accelerator='cuda': the only negative value allowed "
            r"is -1 \(all devices\)\. " + ALLOWED + r" Pass devices=-1 for all devices or a positive count\.",
        ),
        ("-3", ValueError, r"devices='-3' .*the only negative value allowed is -1"),
        (
            True,
            TypeError,
            r"devices=True is not valid for accelerator='cuda': a bool does not say how many "
            r"devices to use\. "
            + ALLOWED
            + r" Pass devices=1 for one device or devices=-1 for all of them\.",
        ),
        (False, TypeError, r"devices=False .*a bool"),
        (
            2.0,
            TypeError,
            r"devices=2\.0 is not valid for accelerator='cuda': it is a float\. "
            + ALLOWED
            + r" Pass an int such as devices=2\.",
        ),
        (
            "two",
            ValueError,
            r"devices='two' is not valid for accelerator='cuda': the string is not 'auto', an "
            r"integer or a comma-separated list of indices\. "
            + ALLOWED
            + r" Pass e\.g\. devices=2 or devices='0,1'\.",
        ),
        ("", ValueError, r"devices='' .*the string is not 'auto'"),
        ("1.5", ValueError, r"devices='1\.5' .*the string is not 'auto'"),
        (
            ",",
            ValueError,
            r"devices=',' is not valid for accelerator='cuda': the comma list names no index\.",
        ),
        ("0,x", ValueError, r"devices='0,x' .*'x' in the comma list is not an integer index\."),
        (
            "0,-1",
            ValueError,
            r"devices='0,-1' .*device indices must be 0 or more, got -1\. "
            + ALLOWED
            + r" To use all devices pass devices=-1 on its own\.",
        ),
        (
            [],
            ValueError,
            r"devices=\[\] is not valid for accelerator='cuda': an empty list selects no device\. "
            + ALLOWED
            + r" Pass at least one index, e\.g\. \[0\]\.",
        ),
        (
            [0, 0],
            ValueError,
            r"devices=\[0, 0\] is not valid for accelerator='cuda': device 0 is listed more than "
            r"once\. " + ALLOWED + r" List each index once, e\.g\. \[0, 1\]\.",
        ),
        ("1,1", ValueError, r"devices='1,1' .*device 1 is listed more than once"),
        ([0, "a"], TypeError, r"devices=\[0, 'a'\] .*every device index must be an int, got 'a' \(str\)\."),
        ([0, True], TypeError, r"every device index must be an int, got True \(bool\)"),
        ([0.0], TypeError, r"every device index must be an int, got 0\.0 \(float\)"),
        ([0, -1], ValueError, r"device indices must be 0 or more, got -1"),
        (
            None,
            TypeError,
            r"devices=None is not valid for accelerator='cuda': expected an int, a str, or a list "
            r"of ints, got NoneType\. " + ALLOWED + r" Pass e\.g\. devices='auto' or devices=1\.",
        ),
        ({0: 1}, TypeError, r"got dict"),
        (
            [0, 4],
            ValueError,
            r"devices=\[0, 4\] asks for cuda device 4, but only 4 cuda device\(s\) are visible "
            r"here \(indices 0\.\.3\)\. Pick indices below 4, or check which devices this process is "
            r"allowed to see\.",
        ),
        ("7,", ValueError, r"asks for cuda device 7, but only 4"),
        (
            5,
            ValueError,
            r"devices=5 asks for 5 cuda devices, but only 4 are visible here\. Use devices=4 or "
            r"fewer, or devices=-1 for all of them\.",
        ),
        ("8", ValueError, r"devices='8' asks for 8 cuda devices, but only 4"),
    ],
)
def test_rejected_values(devices: Any, error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        parse_device_indices(devices, visible=4, accelerator="cuda")


@pytest.mark.parametrize("devices", ["auto", -1, 1, [0]])
def test_nothing_visible(devices: Any) -> None:
    with pytest.raises(
        ValueError, match=r"(none are visible here|only 0 cuda device\(s\) are visible here \(none\))"
    ):
        parse_device_indices(devices, visible=0, accelerator="cuda")


@pytest.mark.parametrize(("devices", "expected"), [("auto", 1), (1, 1), (3, 3), ("4", 4), (" 2 ", 2)])
def test_process_count_accepted(devices: Any, expected: int) -> None:
    assert parse_process_count(devices) == expected


PROCESSES = re.escape(
    "Allowed: 'auto' (one process) or a positive int N (N processes), also as a string such as '2'."
)


@pytest.mark.parametrize(
    ("devices", "error", "message"),
    [
        (
            -1,
            ValueError,
            r"devices=-1 means 'all devices' on GPUs, but for accelerator='cpu', `devices` is the "
            r"number of processes to start, so -1 has no meaning here\. "
            + PROCESSES
            + r" Pass the number of processes, e\.g\. devices=2\.",
        ),
        ("-1", ValueError, r"devices='-1' means 'all devices' on GPUs"),
        (
            [0, 1],
            ValueError,
            r"devices=\[0, 1\] lists device indices, but for accelerator='cpu', `devices` is the "
            r"number of processes to start; there are no indices to pick\. "
            + PROCESSES
            + r" Pass devices=2 to run two processes\.",
        ),
        ("0,1", ValueError, r"devices='0,1' lists device indices"),
        ([], ValueError, r"devices=\[\] lists device indices"),
        (
            0,
            ValueError,
            r"devices=0 is not valid for accelerator='cpu': 0 selects no device\. "
            + PROCESSES
            + r" Pass devices=1 or more\.$",
        ),
        (True, TypeError, r"devices=True .*a bool"),
        (1.0, TypeError, r"devices=1\.0 .*float"),
        ("many", ValueError, r"devices='many' .*the string is not 'auto'"),
    ],
)
def test_process_count_rejected(devices: Any, error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        parse_process_count(devices)
