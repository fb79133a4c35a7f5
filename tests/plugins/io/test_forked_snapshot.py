"""AsyncCheckpointIO's forked snapshots: the file holds the state of the call, whatever the parent does next."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as torch_dist

from drivetrain.plugins.io import AsyncCheckpointIO, CheckpointIO, TorchCheckpointIO
from drivetrain.plugins.io.forked import platform_supports_fork, why_not
from drivetrain.trainer import Callback, ModelCheckpoint
from helpers.multiprocess import run_processes
from trainer.trainer_models import Regression, loader, quiet_trainer, regression_data

pytestmark = pytest.mark.skipif(not platform_supports_fork(), reason="forked snapshots need Linux")


class WriterPidIO(TorchCheckpointIO):
    """Writes, into the checkpoint, the id of the process that wrote it."""

    def save_checkpoint(self, checkpoint, path, storage_options=None):
        super().save_checkpoint({**checkpoint, "writer_pid": os.getpid()}, path, storage_options)


class PidWhenPickled:
    """Becomes, in the file, the id of the process that pickled it (the writer)."""

    def __reduce__(self):
        return (int, (os.getpid(),))


def _load(path: Path) -> dict[str, Any]:
    return TorchCheckpointIO().load_checkpoint(path)


def test_the_file_holds_the_state_of_the_call_though_the_parent_changes_it_at_once(tmp_path):
    io = AsyncCheckpointIO(snapshot="auto")  # a local path and CPU tensors, so a fork
    weights = torch.zeros(512, 1024)  # 2 MiB: many pages, changed while the child writes
    for step in range(1, 6):
        weights.fill_(float(step))
        io.save_checkpoint({"w": weights, "step": step}, tmp_path / f"step={step}.ckpt")
        weights.fill_(-1.0)  # right after save returns, before the child has written anything
        weights[0, 0] = 1e9
    io.save_checkpoint({"w": weights, "step": 6}, tmp_path / "last.ckpt")
    io.teardown()
    for step in range(1, 6):
        saved = _load(tmp_path / f"step={step}.ckpt")
        assert saved["step"] == step
        assert torch.equal(saved["w"], torch.full((512, 1024), float(step)))
    last = _load(tmp_path / "last.ckpt")["w"]
    assert last[0, 0] == 1e9 and last[1, 1] == -1.0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt"] + [
        f"step={s}.ckpt" for s in range(1, 6)
    ]


def test_auto_forks_for_local_cpu_saves_and_copies_otherwise(tmp_path):
    assert AsyncCheckpointIO().snapshot == "copy"  # the default: a fork moves the cost into the next step
    auto_plain = AsyncCheckpointIO(snapshot="auto")
    auto_plain.save_checkpoint({"writer": PidWhenPickled()}, tmp_path / "plain.ckpt")
    auto_plain.teardown()
    assert torch.load(tmp_path / "plain.ckpt", weights_only=False)["writer"] != os.getpid()
    default = AsyncCheckpointIO()
    default.save_checkpoint({"writer": PidWhenPickled()}, tmp_path / "default.ckpt")
    default.teardown()
    assert torch.load(tmp_path / "default.ckpt", weights_only=False)["writer"] == os.getpid()

    forked = AsyncCheckpointIO(WriterPidIO(), snapshot="fork")
    forked.save_checkpoint({"w": torch.ones(3)}, tmp_path / "forked.ckpt")
    forked.teardown()
    assert _load(tmp_path / "forked.ckpt")["writer_pid"] != os.getpid()

    copied = AsyncCheckpointIO(WriterPidIO(), snapshot="copy")
    copied.save_checkpoint({"w": torch.ones(3)}, tmp_path / "copied.ckpt")
    copied.teardown()
    assert _load(tmp_path / "copied.ckpt")["writer_pid"] == os.getpid()

    # "auto" with a subclass that has a save_checkpoint of its own: it may keep state in this
    # process, so it is not run in a forked child.
    auto = AsyncCheckpointIO(WriterPidIO(), snapshot="auto")
    auto.save_checkpoint({"w": torch.ones(3)}, tmp_path / "auto.ckpt")
    auto.teardown()
    assert _load(tmp_path / "auto.ckpt")["writer_pid"] == os.getpid()


def test_auto_copies_when_the_save_comes_from_another_thread(tmp_path):
    io = AsyncCheckpointIO(WriterPidIO(), snapshot="fork")
    raised: list[BaseException] = []

    def save() -> None:
        try:
            io.save_checkpoint({"w": torch.ones(2)}, tmp_path / "thread.ckpt")
        except BaseException as error:
            raised.append(error)

    thread = threading.Thread(target=save)
    thread.start()
    thread.join()
    assert len(raised) == 1 and "main thread" in str(raised[0]) and "snapshot='auto'" in str(raised[0])
    io.teardown()
    assert not (tmp_path / "thread.ckpt").exists()
    # "auto" copies there instead (the plain TorchCheckpointIO would fork from the main thread).
    auto = AsyncCheckpointIO(snapshot="auto")
    thread = threading.Thread(
        target=auto.save_checkpoint, args=({"writer": PidWhenPickled()}, tmp_path / "t.ckpt")
    )
    thread.start()
    thread.join()
    auto.teardown()
    assert torch.load(tmp_path / "t.ckpt", weights_only=False)["writer"] == os.getpid()  # written here


def test_why_not_names_each_unsafe_case(tmp_path):
    assert why_not({"w": torch.ones(2), "nested": [torch.zeros(1)]}, tmp_path / "a.ckpt") is None
    assert "remote" in why_not({"w": torch.ones(2)}, "s3://bucket/a.ckpt")
    meta = why_not({"w": torch.empty(2, device="meta")}, tmp_path / "a.ckpt")
    assert meta is not None and "meta" in meta and "not a plain CPU tensor" in meta


def test_explicit_fork_where_it_is_not_safe_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match=r"snapshot='bgsave'.*'copy', 'auto', 'fork'"):
        AsyncCheckpointIO(snapshot="bgsave")

    class OwnIO(CheckpointIO):
        def save_checkpoint(self, checkpoint, path, storage_options=None): ...
        def load_checkpoint(self, path, map_location=None): ...
        def remove_checkpoint(self, path): ...

    with pytest.raises(ValueError, match=r"TorchCheckpointIO.*got OwnIO.*snapshot='copy'"):
        AsyncCheckpointIO(OwnIO(), snapshot="fork")
    io = AsyncCheckpointIO(snapshot="fork")
    with pytest.raises(ValueError, match=r"cannot save to 's3://bucket/a.ckpt' by a fork: .*remote"):
        io.save_checkpoint({"w": torch.ones(2)}, "s3://bucket/a.ckpt")
    with pytest.raises(ValueError, match=r"not a plain CPU tensor \(Tensor on meta\)"):
        io.save_checkpoint({"w": torch.empty(2, device="meta")}, tmp_path / "a.ckpt")
    io.teardown()
    assert list(tmp_path.iterdir()) == []


def test_a_failure_in_the_child_is_raised_in_the_parent_and_the_previous_checkpoint_stays(tmp_path):
    io = AsyncCheckpointIO(snapshot="fork")
    io.save_checkpoint({"w": torch.ones(4)}, tmp_path / "last.ckpt")
    io.load_checkpoint(tmp_path / "last.ckpt")  # written
    io.save_checkpoint({"w": torch.zeros(4), "bad": lambda: 0}, tmp_path / "last.ckpt")  # cannot be pickled
    with pytest.raises(AttributeError, match="Can't pickle local object") as raised:
        io.load_checkpoint(tmp_path / "last.ckpt")  # waits for the save, then raises its failure
    notes = "".join(getattr(raised.value, "__notes__", []))
    if sys.version_info >= (3, 11):
        assert "Traceback in the process that wrote the checkpoint" in notes
        assert "last.ckpt" in notes
    io.teardown()
    assert torch.equal(_load(tmp_path / "last.ckpt")["w"], torch.ones(4))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt"]


class KilledWriterIO(TorchCheckpointIO):
    """Kills its own process with SIGKILL in the middle of the write (after the temporary file exists)."""

    def save_checkpoint(self, checkpoint, path, storage_options=None):
        def write_then_die(file):
            file.write(b"partial")
            os.kill(os.getpid(), signal.SIGKILL)

        from drivetrain.plugins.io.atomic import write_file

        write_file(path, write_then_die)


def test_a_writer_killed_by_a_signal_is_reported_and_leaves_nothing(tmp_path):
    TorchCheckpointIO().save_checkpoint({"w": torch.ones(2)}, tmp_path / "last.ckpt")
    io = AsyncCheckpointIO(KilledWriterIO(), snapshot="fork")
    io.save_checkpoint({"w": torch.zeros(2)}, tmp_path / "last.ckpt")
    with pytest.raises(RuntimeError, match=r"last.ckpt' was killed by SIGKILL.*previous file .* untouched"):
        io.teardown()
    assert torch.equal(_load(tmp_path / "last.ckpt")["w"], torch.ones(2))
    assert [p.name for p in tmp_path.iterdir()] == ["last.ckpt"]  # the partial file was removed


_ORPHAN_PROGRAM = textwrap.dedent(
    """
    import os, signal, sys
    import torch
    from drivetrain.plugins.io import AsyncCheckpointIO, TorchCheckpointIO

    class Stuck(TorchCheckpointIO):
        def save_checkpoint(self, checkpoint, path, storage_options=None):
            with open(sys.argv[2], "w") as f:  # the writer announces itself, then never finishes
                f.write(str(os.getpid()))
            while True:
                signal.pause()

    io = AsyncCheckpointIO(Stuck(), snapshot="fork")
    io.save_checkpoint({"w": torch.ones(1 << 20)}, os.path.join(sys.argv[1], "a.ckpt"))
    print("saved", flush=True)
    signal.pause()
    """
)


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")  # exited, not yet reaped
    except FileNotFoundError:
        return True


def test_killing_the_parent_kills_its_writer(tmp_path):
    announced = tmp_path / "writer.pid"
    parent = subprocess.Popen(
        [sys.executable, "-c", _ORPHAN_PROGRAM, str(tmp_path), str(announced)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    try:
        assert parent.stdout is not None and parent.stdout.readline().strip() == "saved"
        deadline = time.monotonic() + 60
        while not (announced.exists() and announced.read_text()) and time.monotonic() < deadline:
            time.sleep(0.05)
        writer = int(announced.read_text())
        assert writer != parent.pid and not _gone(writer)
    finally:
        parent.kill()
        parent.wait(timeout=60)
        if parent.stdout is not None:
            parent.stdout.close()
    deadline = time.monotonic() + 30
    while not _gone(writer) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _gone(writer), f"the writer {writer} outlived its killed parent"
    assert not (tmp_path / "a.ckpt").exists()


def _ddp_saves(rank: int, world: int, folder: str) -> dict[str, Any]:
    recorded: dict[int, dict[str, torch.Tensor]] = {}

    class Record(Callback):
        def on_train_batch_end(self, trainer: Any, module: Any, *args: Any) -> None:
            recorded[trainer.global_step] = {k: v.clone() for k, v in module.state_dict().items()}

    torch.manual_seed(0)
    model = Regression()
    checkpoint = ModelCheckpoint(
        dirpath=folder, every_n_train_steps=1, save_top_k=-1, save_last=True, filename="{step}"
    )
    trainer = quiet_trainer(
        strategy="ddp",
        devices=2,
        max_epochs=2,
        callbacks=[Record(), checkpoint],
        enable_checkpointing=True,
        plugins=[AsyncCheckpointIO(snapshot="fork")],
    )
    trainer.fit(model, loader(regression_data(32), batch_size=4, shuffle=True))
    # Each rank also saves a file of its own, then joins a collective while its writer runs.
    io = AsyncCheckpointIO(snapshot="fork")
    value = torch.full((1000,), float(rank + 1))
    # (A folder per rank: a save tidies its folder, and would remove another process's temporary files.)
    own = Path(folder) / f"rank{rank}" / "own.ckpt"
    io.save_checkpoint({"value": value}, own)
    torch_dist.all_reduce(value)
    io.teardown()
    return {"recorded": recorded, "own": _load(own)["value"], "reduced": value}


@pytest.mark.multiprocess
def test_ddp_ranks_save_through_forked_writers(tmp_path):
    ranks = run_processes(_ddp_saves, 2, timeout=120, args=(str(tmp_path / "checkpoints"),))
    recorded = ranks[0]["recorded"]
    assert sorted(recorded) == list(range(1, 9))
    for step, expected in recorded.items():
        saved = torch.load(tmp_path / "checkpoints" / f"step={step}.ckpt", weights_only=False)
        assert saved["global_step"] == step
        for key, value in expected.items():
            assert torch.equal(saved["state_dict"][key], value), (step, key)
    for rank, result in enumerate(ranks):
        assert torch.equal(result["own"], torch.full((1000,), float(rank + 1)))
        assert torch.equal(result["reduced"], torch.full((1000,), 3.0))
