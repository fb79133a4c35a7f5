"""The machine-load probe, fed recorded /proc contents."""

from __future__ import annotations

from benchmarks.load import Load, probe, warning

STAT_BEFORE = "cpu  1000 0 500 8000 100 0 0 0 0 0\ncpu0 ...\n"
STAT_AFTER = "cpu  1150 0 550 8150 100 0 0 0 0 0\ncpu0 ...\n"


def _reader(running: list[int], averages: str = "2.50 1.20 0.80") -> tuple[object, list[float]]:
    stats = iter([STAT_BEFORE, STAT_AFTER])
    counts = iter(running)
    slept: list[float] = []

    def read(path: str) -> str:
        if path == "/proc/stat":
            return next(stats)
        count = next(counts, 1)
        return f"{averages} {count}/900 12345\n"

    return read, slept


def test_probe_counts_runnable_tasks_besides_itself_and_the_busy_share() -> None:
    read, slept = _reader([1, 3, 5, 3])
    load = probe(seconds=0.4, samples=4, read=read, sleep=slept.append, cores=2)
    assert load.runnable == 2.0  # (0 + 2 + 4 + 2) / 4: the probe itself is not counted
    assert load.busy == 200 / 350  # 150 user + 50 system out of 350 jiffies
    assert load.load_average == (2.5, 1.2, 0.8)
    assert slept == [0.1] * 4
    assert not load.too_busy  # two runnable tasks on two cores is at most one per core


def test_more_runnable_tasks_than_cores_is_too_busy_and_warns() -> None:
    quiet = Load((0.1, 0.1, 0.1), 0.3, 0.05, 2)
    busy = Load((6.0, 5.0, 4.0), 5.5, 1.0, 2)
    assert busy.too_busy
    assert warning("ab", quiet, quiet) is None
    text = warning("ab", quiet, busy)
    assert text is not None
    assert "machine busy after ab: up to 5.5 runnable tasks besides the suite on 2 cores" in text


def test_an_unreadable_proc_gives_no_readings_and_no_warning() -> None:
    def read(path: str) -> str:
        raise OSError("no /proc here")

    load = probe(read=read, sleep=lambda _: None, cores=4)
    assert load == Load(None, None, None, 4)
    assert not load.too_busy
    assert load.describe() == "not readable here"
