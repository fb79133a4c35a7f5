"""kill -9 during a checkpoint save, at many points spread over the write: the run always resumes intact.

For each save path a program trains a tiny model for 6 steps, saving every 2. After the first
save it arms a kill switch (:mod:`helpers.kill_points`) that sends the process ``SIGKILL`` at the
N-th file-system event (a chunk written, an fsync, a rename, a deletion) of the saves that follow.
One uninterrupted run counts the events and records the weights after every step; then, for each
kill point, a fresh process is killed there and another one resumes the way a user would
(``ckpt_path="last"``, the path given, ``load_state()``). A trial passes when

* every checkpoint the crash left under a real name holds the weights of the step it says;
* the resume finds a checkpoint (never starts from scratch), and the weights it starts from are
  exactly the uninterrupted run's at that step;
* training on to the end gives exactly the uninterrupted run's final weights;
* nothing a crashed save left behind survives the next save.

Kill points: every event of the two saves that is not a chunk written (fsync, rename, creation,
deletion: where publishing and pruning happen), the chunks filling the rest, evenly spaced.
CI runs ``KILL_POINTS`` per path (24 single-process, 2 sharded); ``DRIVETRAIN_KILL_POINTS=100``
is the full sweep whose figures ``docs/checkpoints.md`` reports (``DRIVETRAIN_FAULTS_REPORT=<file>``
collects them: one line per save path; ``DRIVETRAIN_KILL_POINTS_PART=i/n`` runs every n-th kill
point from the i-th, to split a sweep over processes).

Cost: a single-process path starts its program once (:class:`Driver`): it runs to the first
save, then forks the killed writer once per kill point, so a kill point costs the resume (a
process forked from this warm one) and no training up to the save. The sharded paths launch their
2 ranks per kill point (a process group does not survive a fork), hence fewer kill points in CI.
"""

from __future__ import annotations

import contextlib
import datetime
import importlib
import io
import multiprocessing
import os
import pickle
import signal
import sys
import time
import traceback
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import drivetrain as dt
from drivetrain._utilities.imports import package_available
from drivetrain.plugins import AsyncCheckpointIO
from drivetrain.plugins.io.atomic import is_complete, is_temporary
from drivetrain.strategies.launchers.parent_death import set_parent_death_signal
from drivetrain.trainer import Callback, ModelCheckpoint
from drivetrain.utils import ProjectConfiguration, set_seed
from faults.jobs import report
from helpers import kill_points
from trainer.trainer_models import Regression, quiet_trainer

pytestmark = pytest.mark.faults

STEPS, EVERY = 6, 2
Weights = dict[str, torch.Tensor]


# -- the programs ------------------------------------------------------------------------------------
def _data() -> TensorDataset:
    generator = torch.Generator().manual_seed(3)
    x = torch.randn(24, 4, generator=generator)
    return TensorDataset(x, x.sum(dim=1, keepdim=True) + 0.1 * torch.randn(24, 1, generator=generator))


class Scored(Regression):
    """Adam and a score that grows each step, so every save is a new best for top-k."""

    def __init__(self) -> None:
        super().__init__(lr=0.05, optimizer="adam")

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        self.log("score", float(self.global_step))
        return super().training_step(batch, batch_idx)


class Observe(Callback):
    """Arms the kill switch after the first save; records weights after each step and where a run started."""

    def __init__(self, weights: Callable[[dt.Trainer, Any], Weights]) -> None:
        self.weights = weights
        self.at_step: dict[int, Weights] = {}
        self.start: tuple[int, Weights] | None = None

    def on_train_start(self, trainer: dt.Trainer, module: Any) -> None:
        self.start = (trainer.global_step, self.weights(trainer, module))

    def on_train_batch_start(self, trainer: dt.Trainer, module: Any, *args: Any) -> None:
        if trainer.global_step == EVERY:
            io = trainer.strategy.checkpoint_io
            if isinstance(io, AsyncCheckpointIO):
                # The first save written, and no worker thread at the sweep's forks (a forked
                # child has no threads: its queue would wait for a worker that is not there).
                io.teardown()
            kill_points.arm()

    def on_train_batch_end(self, trainer: dt.Trainer, module: Any, *args: Any) -> None:
        self.at_step[trainer.global_step] = self.weights(trainer, module)


class SaveEvery(Callback):
    """``trainer.save_checkpoint`` to one path every EVERY steps (the path is overwritten)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def on_train_batch_end(self, trainer: dt.Trainer, *args: Any) -> None:
        if trainer.global_step % EVERY == 0:
            trainer.save_checkpoint(self.path)


def _local_weights(trainer: dt.Trainer, module: Any) -> Weights:
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def _gathered_weights(trainer: dt.Trainer, module: Any) -> Weights:
    return {k: v.detach().clone() for k, v in trainer.strategy.get_module_state_dict(module).items()}


def _saving_callbacks(kind: str, folder: Path) -> list[Callback]:
    if kind == "last":
        return [ModelCheckpoint(dirpath=folder, every_n_train_steps=EVERY, save_top_k=0, save_last=True)]
    if kind == "top_k":
        return [
            ModelCheckpoint(
                dirpath=folder,
                every_n_train_steps=EVERY,
                monitor="score",
                mode="max",
                save_top_k=1,
                filename="{step}",
            )
        ]
    if kind == "every_n":
        return [ModelCheckpoint(dirpath=folder, every_n_train_steps=EVERY, save_top_k=1, filename="{step}")]
    if kind.startswith("top_k_last"):  # two files per save: the top-k one, then last.ckpt
        return [
            ModelCheckpoint(
                dirpath=folder,
                every_n_train_steps=EVERY,
                monitor="score",
                mode="max",
                save_top_k=1,
                save_last=True,
                filename="{step}",
            )
        ]
    return [SaveEvery(folder / "manual.ckpt")]


def _plugins(kind: str) -> list[Any]:
    """``top_k_last@copy`` / ``@fork``: the saves go through AsyncCheckpointIO with that snapshot."""
    _, _, snapshot = kind.partition("@")
    return [AsyncCheckpointIO(snapshot=snapshot)] if snapshot else []


def trainer_program(
    kind: str, folder: str, kill_at: int | None, resume: bool, devices: int = 1, sweep: Any = None
) -> dict[str, Any]:
    """Fit (or resume) with one of the Trainer's save paths; the result is what the checks need."""
    warnings.filterwarnings("ignore", message="Skipping incomplete")
    if devices > 1 and dist.get_rank() != 0:
        kill_at = None  # the kill points are rank 0's events; the launcher then kills rank 1 too
    if not resume:
        kill_points.install(kill_at, folder, sweep)
    root = Path(folder)
    observe = Observe(_gathered_weights if devices > 1 else _local_weights)
    callbacks: list[Callback] = [observe, *_saving_callbacks(kind, root)]
    strategy: Any = "fsdp" if devices > 1 else "auto"
    trainer = quiet_trainer(
        strategy=strategy,
        devices=devices,
        max_steps=STEPS,
        enable_checkpointing=kind != "save_checkpoint",  # that path saves without a ModelCheckpoint
        default_root_dir=folder,
        callbacks=callbacks,
        plugins=_plugins(kind) or None,
    )
    torch.manual_seed(0)
    data = DataLoader(_data(), batch_size=3, shuffle=True)
    ckpt_path = None
    if resume:
        ckpt_path = str(root / "manual.ckpt") if kind == "save_checkpoint" else "last"
    trainer.fit(Scored(), data, ckpt_path=ckpt_path)
    return {"at_step": observe.at_step, "start": observe.start, "events": kill_points.events()}


class Progress:
    def __init__(self) -> None:
        self.step = 0

    def state_dict(self) -> dict[str, int]:
        return {"step": self.step}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.step = state["step"]


def accelerator_program(
    kind: str, folder: str, kill_at: int | None, resume: bool, devices: int = 1, sweep: Any = None
) -> dict[str, Any]:
    """A loop with ``save_state`` every EVERY steps: to one folder (``manual``), a folder per save
    (``folders``: ``step_<N>``, resumed from the newest folder as Accelerate's examples do) or
    automatic ones."""
    _quiet()
    if devices > 1 and dist.get_rank() != 0:
        kill_at = None  # the kill switch counts (and kills) on rank 0 only
    if not resume:
        kill_points.install(kill_at, folder, sweep)
    root = Path(folder)
    automatic = kind == "automatic"
    if devices > 1:
        from helpers.sharded import LR, Net, batches, shard

        accelerator = dt.Accelerator(
            accelerator="cpu",
            strategy="deepspeed_stage_2",
            devices=devices,
            project_config=ProjectConfiguration(
                project_dir=folder, automatic_checkpoint_naming=True, total_limit=1
            ),
        )
        torch.manual_seed(0)
        model: nn.Module = Net()
        optimizer = torch.optim.Adam(model.parameters(), lr=LR)
        rank = accelerator.process_index
        loader: Any = [shard(batch, rank) for batch in batches(STEPS)]
        model, optimizer = accelerator.prepare(model, optimizer)
    else:
        config = ProjectConfiguration(
            project_dir=folder, automatic_checkpoint_naming=automatic, total_limit=1
        )
        accelerator = dt.Accelerator(cpu=True, project_config=config)
        set_seed(0)
        model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
        optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
        data = DataLoader(_data(), batch_size=3, shuffle=True)
        model, optimizer, loader = accelerator.prepare(model, optimizer, data)
    progress = Progress()
    accelerator.register_for_checkpointing(progress)

    def weights() -> Weights:
        return {k: v.detach().clone() for k, v in accelerator.get_state_dict(model).items()}

    def save() -> None:
        accelerator.save_state(
            None if automatic else root / f"step_{progress.step}" if kind == "folders" else root / "manual"
        )

    def newest_folder() -> Path:  # Accelerate's examples: the folder made last
        return max((p for p in root.iterdir() if p.is_dir()), key=lambda p: p.stat().st_ctime)

    start = None
    if resume:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            accelerator.load_state(
                None if automatic else newest_folder() if kind == "folders" else root / "manual"
            )
        start = (progress.step, weights())
        if devices > 1:
            loader = loader[progress.step :]  # the sharded program's batches are a plain list
    at_step = {}
    for x, y in loader:
        if progress.step >= STEPS:
            break
        if progress.step == EVERY:
            kill_points.arm()
        loss = nn.functional.mse_loss(model(x).float(), y)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        progress.step += 1
        at_step[progress.step] = weights()
        if progress.step % EVERY == 0:
            save()
    return {"at_step": at_step, "start": start, "events": kill_points.events()}


# -- running one process, or two ranks -----------------------------------------------------------------
def _child(
    connection: Any,
    function: Callable[..., Any],
    args: tuple[Any, ...],
    rank: int = 0,
    world: int = 1,
    port: int = 0,
) -> None:
    torch.set_num_threads(1)
    if world > 1:  # torchrun's contract, and the default process group over the parent's store
        os.environ.update(
            RANK=str(rank),
            LOCAL_RANK=str(rank),
            WORLD_SIZE=str(world),
            LOCAL_WORLD_SIZE=str(world),
            NODE_RANK="0",
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            OMP_NUM_THREADS="1",
        )
    # Plain pickle bytes: torch's pickler for pipes shares tensors through memory that dies with this process.
    try:
        if world > 1:
            store = dist.TCPStore(
                "127.0.0.1", port, world, is_master=False, timeout=datetime.timedelta(seconds=60)
            )
            dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
        outcome: tuple[str, Any] = ("ok", function(*args))
    except BaseException:
        outcome = ("error", traceback.format_exc())
    if kill_points.swept():  # a sweep's child that was not killed: its driver tells the parent how it ended
        if outcome[0] != "ok":
            print(outcome[1], file=sys.stderr, flush=True)
        os._exit(0 if outcome[0] == "ok" else 1)
    try:
        connection.send_bytes(pickle.dumps(outcome))
    finally:
        connection.close()
        os._exit(0)


def _fork(function: Callable[..., Any], *args: Any, world: int = 1, timeout: float = 100) -> tuple[str, Any]:
    """Run ``function(*args)`` in ``world`` forked processes (rank 0's outcome counts).

    Returns ``("ok", result)``, ``("error", traceback)`` or ``("killed", None)``. As a launcher does,
    when one process is killed the others are killed too.
    """
    context = multiprocessing.get_context("fork")
    store = None
    if world > 1:
        store = dist.TCPStore("127.0.0.1", 0, world, is_master=True, wait_for_workers=False)
    processes, pipes = [], []
    for rank in range(world):
        receiving, sending = context.Pipe(duplex=False)
        extra = (rank, world, store.port) if store is not None else ()
        process = context.Process(target=_child, args=(sending, function, args, *extra), daemon=True)
        process.start()
        sending.close()
        processes.append(process)
        pipes.append(receiving)
    outcomes: dict[int, Any] = {}
    deadline = time.monotonic() + timeout
    try:
        while len(outcomes) < world:
            if any(process.exitcode == -signal.SIGKILL for process in processes):
                return "killed", None
            for rank, (process, receiving) in enumerate(zip(processes, pipes)):
                if rank in outcomes:
                    continue
                if receiving.poll(0.02):
                    try:
                        outcomes[rank] = pickle.loads(receiving.recv_bytes())
                    except (EOFError, OSError):  # died without reporting
                        process.join(5)
                        if process.exitcode == -signal.SIGKILL:
                            return "killed", None
                        outcomes[rank] = (
                            "error",
                            f"rank {rank} exited with {process.exitcode} without reporting",
                        )
            if time.monotonic() > deadline:
                raise AssertionError(f"{function.__name__}{args} did not finish within {timeout:.0f} s")
    finally:
        for process in processes:
            if process.is_alive():
                process.kill()
            process.join(5)
        del store
    errors = [outcome[1] for outcome in outcomes.values() if outcome[0] != "ok"]
    if errors:
        return "error", "\n".join(errors)
    return outcomes[0]


def _run(
    program: Callable[..., Any], kind: str, folder: Path, kill_at: int | None, resume: bool, devices: int
) -> tuple[str, Any]:
    return _fork(program, kind, str(folder), kill_at, resume, devices, world=devices)


class Driver:
    """One process that runs a single-process program up to its arm point, then forks a killed writer per kill point."""

    def __init__(self, program: Callable[..., Any], kind: str, folder: Path) -> None:
        context = multiprocessing.get_context("fork")
        self.connection, theirs = context.Pipe(duplex=True)
        self.process = context.Process(
            target=_lead,
            args=(theirs, self.connection, program, (kind, str(folder), None, False, 1, theirs)),
            daemon=True,
        )
        self.process.start()
        theirs.close()

    def kill_at(self, kill_at: int, timeout: float = 60) -> str:
        """Put the folder back as it was at the arm point and kill a writer at ``kill_at``: how it ended."""
        self.connection.send(kill_at)
        if not self.connection.poll(timeout):
            self.close()
            raise AssertionError(f"the writer killed at event {kill_at} did not end within {timeout:.0f} s")
        answer = self.connection.recv()
        if answer == "killed":
            return "killed"
        if isinstance(answer, tuple):  # the driver failed before its arm point
            return f"the program failed before the save: {answer[1]}"
        return f"the writer was not killed (exit code {answer})"

    def close(self) -> None:
        if self.process.is_alive():
            try:
                self.connection.send(None)
            except OSError:
                pass
            self.process.join(10)
        if self.process.is_alive():
            os.killpg(self.process.pid, signal.SIGKILL)  # the driver and a writer it forked
            self.process.join(5)
        self.connection.close()


def _lead(connection: Any, ours: Any, program: Callable[..., Any], args: tuple[Any, ...]) -> None:
    os.setpgid(0, 0)  # its own process group, so that close() can end the driver and its writer together
    set_parent_death_signal()  # and if this test process dies, the driver goes too
    ours.close()  # the test's end, inherited: with it closed here, the driver sees the test end
    _child(connection, program, args)


def _quiet() -> None:
    warnings.filterwarnings("ignore", message="Skipping incomplete")
    warnings.filterwarnings(
        "ignore", message=r".* is deprecated\. Please use .*_single", category=FutureWarning
    )
    warnings.filterwarnings(
        "ignore", message=r"`torch\.jit\.script_method` is deprecated", category=DeprecationWarning
    )


# -- checks --------------------------------------------------------------------------------------------
def _same(a: Weights, b: Weights) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _leftovers(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if is_temporary(p.name))


def _checkpoints(folder: Path) -> list[str]:
    """The checkpoints (files and folders) under ``folder``, by their names relative to it."""
    found = {p for p in folder.rglob("*") if p.suffix == ".ckpt" or p.name.startswith("checkpoint_")}
    return sorted(str(p.relative_to(folder)) for p in found if not any(q in found for q in p.parents))


def _checkpoints_claim_their_weights(
    folder: Path, reference: dict[int, Weights], devices: int
) -> tuple[str | None, int | None]:
    """Every complete single-file checkpoint under a real name holds the weights of the step it records.

    Returns the problem found, if any, and the newest step a complete checkpoint holds. Sharded
    folders are checked by resuming from them; their step is in the folder's own state file.
    """
    if devices > 1:
        steps = [
            torch.load(path / "drivetrain_state.pt", weights_only=True)["values"].get("global_step")
            for path in folder.glob("*.ckpt")
            if path.is_dir() and not is_temporary(path.name) and is_complete(path)
        ]
        return None, max((step for step in steps if step is not None), default=None)
    newest = None
    for path in sorted(folder.rglob("*.ckpt")):
        if is_temporary(path.name) or not path.is_file() or not is_complete(path):
            continue
        checkpoint = torch.load(path, weights_only=True)
        step = checkpoint["global_step"] if "global_step" in checkpoint else checkpoint["custom_0"]["step"]
        saved = checkpoint["state_dict"]
        expected = {k.removeprefix("module."): v for k, v in reference[step].items()}
        if not _same({k.removeprefix("module."): v for k, v in saved.items()}, expected):
            return f"{path.name} says step {step} but holds other weights", None
        newest = step if newest is None else max(newest, step)
    return None, newest


def _kill_points(events: list[tuple[str, str]], wanted: int) -> list[int]:
    """``wanted`` kill points (1-based event numbers) spread over the saves.

    Every event but a chunk written (each fsync, rename, creation and deletion) is one, since
    that is where publishing and pruning happen; the chunks written fill the rest, evenly spaced.
    A save with at most ``wanted`` events is killed at each of them.
    """
    if wanted >= len(events):
        return list(range(1, len(events) + 1))
    # Always: where a save's last.ckpt begins, its top-k file (if any) already published.
    between = {number for number, (_, where) in enumerate(events, 1) if _starts_last(events, number)}
    steps = [number for number, (kind, _) in enumerate(events, 1) if kind != "write"]
    writes = [number for number, (kind, _) in enumerate(events, 1) if kind == "write"]
    if len(steps) >= wanted:
        return sorted({*between, *_spread(steps, wanted)})
    return sorted({*between, *steps, *_spread(writes, wanted - len(steps))})


def _starts_last(events: list[tuple[str, str]], number: int) -> bool:
    """Whether event ``number`` is the first of a write of ``last.ckpt`` (the first on its temporary path)."""
    where = Path(events[number - 1][1])
    temporary = next(
        (part for part in where.parts if part.startswith(".last.ckpt.drivetrain-partial-")), None
    )
    return temporary is not None and not any(temporary in path for _, path in events[: number - 1])


def _spread(numbers: list[int], wanted: int) -> list[int]:
    if wanted <= 1:
        return numbers[len(numbers) // 2 :][:wanted]
    return sorted({numbers[round(i * (len(numbers) - 1) / (wanted - 1))] for i in range(wanted)})


@dataclass(frozen=True)
class SavePath:
    id: str
    name: str
    program: Callable[..., Any]
    kind: str
    devices: int = 1


SAVE_PATHS = [
    SavePath("last", "ModelCheckpoint last", trainer_program, "last"),
    SavePath("top_k", "ModelCheckpoint top-k", trainer_program, "top_k"),
    SavePath("every_n", "ModelCheckpoint every-n", trainer_program, "every_n"),
    SavePath("save_checkpoint", "trainer.save_checkpoint", trainer_program, "save_checkpoint"),
    # Two files per save (top-k, then last.ckpt): a kill between them is among the kill points.
    SavePath("top_k_last", "ModelCheckpoint top-k + last", trainer_program, "top_k_last"),
    SavePath("top_k_last_copy", "top-k + last, async (copy)", trainer_program, "top_k_last@copy"),
    SavePath("top_k_last_fork", "top-k + last, async (fork)", trainer_program, "top_k_last@fork"),
    SavePath("save_state_manual", "Accelerator.save_state manual", accelerator_program, "manual"),
    SavePath("save_state_automatic", "Accelerator.save_state automatic", accelerator_program, "automatic"),
    SavePath(
        "save_state_folders", "Accelerator.save_state, a folder per save", accelerator_program, "folders"
    ),
    SavePath("fsdp", "FSDP sharded (2 ranks, Trainer last)", trainer_program, "last", devices=2),
    SavePath("fsdp_top_k_last", "FSDP sharded (2 ranks, top-k + last)", trainer_program, "top_k_last", 2),
    SavePath(
        "deepspeed", "DeepSpeed ZeRO-2 (2 ranks, Accelerator automatic)", accelerator_program, "automatic", 2
    ),
]
#: Kill points per save path: CI runs these; ``DRIVETRAIN_KILL_POINTS=100`` is the full sweep.
KILL_POINTS = {
    1: int(os.environ.get("DRIVETRAIN_KILL_POINTS", 24)),
    2: int(os.environ.get("DRIVETRAIN_KILL_POINTS", 2)),
}


def _marks(path: SavePath) -> list[Any]:
    marks: list[Any] = []
    if path.devices > 1:
        marks.append(pytest.mark.multiprocess)
    if path.program is accelerator_program and path.devices > 1:
        marks += [
            pytest.mark.deepspeed,
            pytest.mark.skipif(not package_available("deepspeed"), reason="needs the deepspeed extra"),
        ]
    return marks


@pytest.fixture(scope="module", autouse=True)
def warm_up() -> None:
    """Pay the first-use costs (lazy imports, first fit) once here, not in every forked run."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = quiet_trainer(max_steps=1)
        trainer.fit(Scored(), DataLoader(_data(), batch_size=3))
        accelerator = dt.Accelerator(cpu=True)
        layer = nn.Linear(4, 1)
        accelerator.prepare(layer, torch.optim.Adam(layer.parameters()))
        for name in ("torch.distributed.checkpoint", "torch.distributed.fsdp"):
            importlib.import_module(name)


def _load_deepspeed_ops() -> None:
    """Load DeepSpeed's compiled communication op once, here: the forked ranks inherit it.

    Otherwise every rank of every run checks the op's build again (ninja; tens of seconds under load).
    """
    from deepspeed.comm.torch import build_shm_op

    with contextlib.redirect_stdout(io.StringIO()):
        build_shm_op()


def _trial(
    path: SavePath, folder: Path, kill_at: int, reference: dict[int, Weights], killed: str, kept: list[str]
) -> list[str]:
    """Check what a kill left in ``folder`` and resume from it: the problems found."""
    if killed != "killed":
        return [killed]
    problems = []
    claim, newest = _checkpoints_claim_their_weights(folder, reference, path.devices)
    if claim:
        problems.append(claim)
    outcome, resumed = _run(path.program, path.kind, folder, None, True, path.devices)
    if outcome != "ok":
        return [*problems, f"the resume failed: {resumed.strip().splitlines()[-1]}"]
    step, weights = resumed["start"]
    if newest is not None and step < newest:
        problems.append(f"resumed at step {step}, though a complete checkpoint of step {newest} was there")
    if step not in reference:
        problems.append(f"resumed at step {step}, which no save wrote")
    elif not _same(weights, reference[step]):
        problems.append(f"resumed at step {step} with other weights than the run had there")
    final = resumed["at_step"].get(STEPS, weights if step == STEPS else {})  # at the end already: no steps
    if not _same(final, reference[STEPS]):
        problems.append("the resumed run ended with other weights than the uninterrupted one")
    if step < STEPS and _leftovers(folder):  # (resumed at the end, there was no next save)
        problems.append(f"left over after the next save: {_leftovers(folder)}")
    if step < STEPS and _checkpoints(folder) != kept:
        problems.append(f"after the next save the folder holds {_checkpoints(folder)}, not {kept}")
    return problems


@pytest.mark.parametrize("path", [pytest.param(path, marks=_marks(path), id=path.id) for path in SAVE_PATHS])
def test_a_kill_during_a_save_leaves_a_checkpoint_the_run_resumes_from_exactly(
    tmp_path: Path, path: SavePath
) -> None:
    if path.program is accelerator_program and path.devices > 1:
        _load_deepspeed_ops()
    outcome, uninterrupted = _run(path.program, path.kind, tmp_path / "reference", None, False, path.devices)
    assert outcome == "ok", uninterrupted
    reference, events = uninterrupted["at_step"], uninterrupted["events"]
    kept = _checkpoints(tmp_path / "reference")  # what a run that is never killed keeps
    assert len(events) > 10 and any(kind == "fsync" for kind, _ in events), events
    points = _kill_points(events, KILL_POINTS[path.devices])
    if "DRIVETRAIN_KILL_POINTS_PART" in os.environ:  # "i/n": the i-th of n sweeps run side by side
        part, parts = map(int, os.environ["DRIVETRAIN_KILL_POINTS_PART"].split("/"))
        points = points[part - 1 :: parts]
    failures, worst = [], 0.0
    driver = Driver(path.program, path.kind, tmp_path / "run") if path.devices == 1 else None
    try:
        for kill_at in points:
            began = time.monotonic()
            kind, where = events[kill_at - 1]
            if driver is not None:
                folder = tmp_path / "run"
                killed = driver.kill_at(kill_at)
            else:
                folder = tmp_path / f"kill{kill_at}"
                outcome, result = _run(path.program, path.kind, folder, kill_at, False, path.devices)
                killed = outcome if outcome == "killed" else f"the program was not killed: {result}"
            problems = _trial(path, folder, kill_at, reference, killed, kept)
            if problems:
                failures.append(
                    f"kill at event {kill_at} ({kind} {Path(where).name}): " + "; ".join(problems)
                )
            worst = max(worst, time.monotonic() - began)
    finally:
        if driver is not None:
            driver.close()
    report(
        f"kill during save: {path.name}",
        len(points),
        len(points) - len(failures),
        worst,
        events=len(events),
    )
    assert not failures, f"{len(failures)} of {len(points)} kill points failed:\n" + "\n".join(failures)
