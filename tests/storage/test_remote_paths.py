"""A path with a scheme is remote storage, reached through fsspec, and never a local folder named after the scheme.

Every entry point that takes a path is driven here with fsspec's ``memory://`` filesystem (in the
test process): the Trainer's ``default_root_dir``, ``ModelCheckpoint(dirpath)``, the folder
loggers, ``ckpt_path``, ``load_from_checkpoint``, the Accelerator's ``project_dir``,
``save_state``/``load_state``, ``save_model`` and ``save``. Each test also checks that the working
directory stayed empty (the defect: a local folder ``memory:`` or ``s3:`` holding the files).
The same programs against a real S3 API are in ``test_s3.py``.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import fsspec
import pytest
import torch
from torch import nn

import drivetrain as dt
from drivetrain.loggers import CSVLogger, TensorBoardLogger
from drivetrain.plugins.io import TorchCheckpointIO, atomic
from drivetrain.trainer import ModelCheckpoint
from drivetrain.utils import ProjectConfiguration
from trainer.trainer_models import Regression, loader, quiet_trainer, regression_data, weights


def files(root: str) -> list[str]:
    """Every file under the ``memory://`` folder ``root``, relative to it."""
    fs = fsspec.filesystem("memory")
    inner = "/" + root.split("://", 1)[1]
    return sorted(os.path.relpath(path, inner) for path in fs.find(inner))


def _fit(
    root: str, max_epochs: int, ckpt_path: str | None = None, **kwargs: Any
) -> tuple[dt.Trainer, Regression]:
    torch.manual_seed(0)
    model = Regression()
    trainer = quiet_trainer(
        default_root_dir=root,
        max_epochs=max_epochs,
        logger="csv",
        log_every_n_steps=1,
        enable_checkpointing=True,
        callbacks=[ModelCheckpoint(save_last=True, **kwargs)],
    )
    trainer.fit(model, loader(regression_data(32), shuffle=True), ckpt_path=ckpt_path)
    return trainer, model


def test_a_trainer_under_a_remote_root_writes_checkpoints_and_logs_there_and_resumes_from_last(
    memory_root: str, local_dir: Path
) -> None:
    trainer, _ = _fit(memory_root, max_epochs=2)
    checkpoint = trainer.checkpoint_callback
    assert checkpoint is not None
    run = "drivetrain_logs/version_0"
    assert checkpoint.best_model_path == f"{memory_root}/{run}/checkpoints/epoch=1-step=8.ckpt"
    assert checkpoint.last_model_path == f"{memory_root}/{run}/checkpoints/last.ckpt"
    assert files(memory_root) == [
        f"{run}/checkpoints/epoch=1-step=8.ckpt",
        f"{run}/checkpoints/last.ckpt",
        f"{run}/hparams.yaml",
        f"{run}/metrics.csv",
    ]
    with fsspec.open(f"{memory_root}/{run}/metrics.csv", "r") as file:
        rows = file.read().splitlines()
    assert rows[0].split(",")[0] == "step" and len(rows) == 9  # a header and one row per step
    assert trainer.log_dir == f"{memory_root}/{run}"

    # Resume from "last" in the remote folder: the same weights as one uninterrupted run.
    resumed, resumed_model = _fit(memory_root, max_epochs=4, ckpt_path="last", dirpath=checkpoint.dirpath)
    assert resumed.global_step == 16
    _, straight = _fit(f"{memory_root}/straight", max_epochs=4)
    for key, value in weights(straight).items():
        assert torch.equal(weights(resumed_model)[key], value), key
    assert os.listdir(local_dir) == []


def test_remote_checkpoint_folders_loggers_and_explicit_checkpoint_paths(
    memory_root: str, local_dir: Path
) -> None:
    csv = CSVLogger(save_dir=f"{memory_root}/logs", name="csv")
    board = TensorBoardLogger(save_dir=f"{memory_root}/logs", name="tb")
    checkpoint = ModelCheckpoint(
        dirpath=f"{memory_root}/ckpts", filename="{step}", save_top_k=-1, every_n_train_steps=2
    )
    torch.manual_seed(0)
    model = Regression()
    trainer = quiet_trainer(
        max_steps=4,
        logger=[csv, board],
        log_every_n_steps=1,
        enable_checkpointing=True,
        callbacks=[checkpoint],
    )
    trainer.fit(model, loader(regression_data(32)))
    written = files(memory_root)
    assert [f for f in written if f.startswith("ckpts/")] == ["ckpts/step=2.ckpt", "ckpts/step=4.ckpt"]
    assert {"logs/csv/version_0/metrics.csv", "logs/csv/version_0/hparams.yaml"} <= set(written)
    assert any(f.startswith("logs/tb/version_0/events.out.tfevents.") for f in written)
    assert csv.log_dir == f"{memory_root}/logs/csv/version_0"
    assert csv.plot() == f"{memory_root}/logs/csv/version_0/metrics.png"
    with fsspec.open(f"{memory_root}/logs/csv/version_0/metrics.png", "rb") as file:
        assert file.read(8) == b"\x89PNG\r\n\x1a\n"

    # An explicit remote ckpt_path, and the module's own loader.
    trainer = quiet_trainer(max_steps=6, enable_checkpointing=False)
    resumed = Regression()
    trainer.fit(resumed, loader(regression_data(32)), ckpt_path=f"{memory_root}/ckpts/step=4.ckpt")
    assert trainer.global_step == 6
    loaded = Regression.load_from_checkpoint(f"{memory_root}/ckpts/step=4.ckpt")
    for key, value in weights(model).items():
        assert torch.equal(weights(loaded)[key], value)
    with pytest.raises(FileNotFoundError, match=r"memory://.*/ckpts/missing\.ckpt"):
        quiet_trainer(max_steps=1).fit(
            Regression(), loader(regression_data(8)), ckpt_path=f"{memory_root}/ckpts/missing.ckpt"
        )
    assert os.listdir(local_dir) == []


def test_resume_from_last_passes_over_a_damaged_remote_checkpoint(memory_root: str, local_dir: Path) -> None:
    _fit(memory_root, max_epochs=1, dirpath=f"{memory_root}/ckpts", filename="{step}", save_top_k=-1)
    assert files(memory_root + "/ckpts") == ["last.ckpt", "step=4.ckpt"]
    with fsspec.open(f"{memory_root}/ckpts/last.ckpt", "rb") as file:
        head = file.read(100)
    with fsspec.open(f"{memory_root}/ckpts/last.ckpt", "wb") as file:
        file.write(head)  # what an interrupted copy by another tool would leave
    with pytest.warns(
        UserWarning, match=r"Skipping incomplete or damaged checkpoint\(s\) 'memory://.*/last\.ckpt'"
    ):
        resumed, _ = _fit(
            memory_root, max_epochs=2, ckpt_path="last", dirpath=f"{memory_root}/ckpts", filename="{step}"
        )
    assert resumed.global_step == 8  # from step=4.ckpt, not from scratch


def _sharded_folder(path: str) -> None:
    """A published sharded checkpoint folder as object storage holds it (its shards left out)."""
    with fsspec.open(f"{path}/drivetrain_state.pt", "wb") as file:
        torch.save({"format": "drivetrain-fsdp-sharded"}, file)
    with fsspec.open(f"{path}/.drivetrain-complete", "wb"):
        pass


def test_the_newest_published_remote_folder_is_last(memory_root: str, local_dir: Path) -> None:
    """A sharded checkpoint in object storage is a folder of objects: it was published when its completion
    marker was written (folders have no time of their own there). ``find_last`` orders by that; on a tie
    (S3 keeps whole seconds) the later name, numbers compared as numbers."""
    folder = f"{memory_root}/ckpts"
    for name in ("score=0.9.ckpt", "score=0.1.ckpt"):  # written in this order; the names sort the other way
        _sharded_folder(f"{folder}/{name}")
    assert ModelCheckpoint(dirpath=folder, filename="{score}").find_last() == f"{folder}/score=0.1.ckpt"
    tied = f"{memory_root}/tied"
    markers = fsspec.filesystem("memory").store
    second = None
    for name in ("step=3.ckpt", "step=6.ckpt", "step=12.ckpt"):
        _sharded_folder(f"{tied}/{name}")
        marker = markers[f"/{tied.split('://', 1)[1]}/{name}/.drivetrain-complete"]
        second = second or marker.modified.replace(microsecond=0)
        marker.modified = second  # all published within one second
        assert ModelCheckpoint(dirpath=tied, filename="{step}").find_last() == f"{tied}/{name}"
    assert os.listdir(local_dir) == []


class _Unpicklable:
    def __reduce__(self) -> Any:
        raise RuntimeError("cannot pickle this")


def test_a_failed_remote_write_keeps_the_previous_checkpoint_and_leaves_no_partial_object(
    memory_root: str,
) -> None:
    io = TorchCheckpointIO()
    path = f"{memory_root}/last.ckpt"
    io.save_checkpoint({"step": torch.tensor(1)}, path)
    with pytest.raises(RuntimeError, match="cannot pickle this"):
        io.save_checkpoint({"weights": torch.ones(1000), "bad": _Unpicklable()}, path)
    assert files(memory_root) == ["last.ckpt"]
    assert io.load_checkpoint(path)["step"] == 1
    # A partial object a killed writer left behind is removed by a save into the folder once it is an hour
    # old (younger, it may be another process's write in progress: object stores have no locks).
    fsspec.filesystem("memory").pipe_file(
        f"/{memory_root[9:]}/.last.ckpt.drivetrain-partial-0123456789ab", b"PK"
    )
    io.save_checkpoint({"step": torch.tensor(2)}, f"{memory_root}/other.ckpt")
    assert len(files(memory_root)) == 3
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(atomic, "_now", lambda: time.time() + 2 * atomic.REMOTE_LEFTOVER_AGE)
        io.save_checkpoint({"step": torch.tensor(3)}, f"{memory_root}/other.ckpt")
    assert files(memory_root) == ["last.ckpt", "other.ckpt"]


def _accelerator(project_dir: str, **config: Any) -> tuple[dt.Accelerator, nn.Module, Any]:
    accelerator = dt.Accelerator(
        cpu=True,
        project_config=ProjectConfiguration(
            project_dir=project_dir, automatic_checkpoint_naming=True, **config
        ),
    )
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    return accelerator, *accelerator.prepare(model, optimizer)


def _step(accelerator: dt.Accelerator, model: nn.Module, optimizer: Any) -> None:
    accelerator.backward(model(torch.randn(2, 4)).pow(2).sum())
    optimizer.step()
    optimizer.zero_grad()


def test_an_accelerator_with_a_remote_project_dir_saves_loads_prunes_and_exports_there(
    memory_root: str, local_dir: Path
) -> None:
    accelerator, model, optimizer = _accelerator(memory_root, total_limit=2)
    for _ in range(3):
        _step(accelerator, model, optimizer)
        saved_to = accelerator.save_state()
    assert saved_to == f"{memory_root}/checkpoints/checkpoint_2"
    assert files(memory_root) == [
        "checkpoints/checkpoint_1/state.ckpt",
        "checkpoints/checkpoint_2/state.ckpt",
    ]
    expected = {k: v.clone() for k, v in model.state_dict().items()}
    state = optimizer.state_dict()

    resumed, model2, optimizer2 = _accelerator(memory_root, total_limit=2)
    assert resumed.load_state() == f"{memory_root}/checkpoints/checkpoint_2"
    for key, value in expected.items():
        assert torch.equal(model2.state_dict()[key], value)
    assert optimizer2.state_dict()["param_groups"] == state["param_groups"]
    resumed.save_state()  # automatic naming counts on from the loaded checkpoint
    assert files(memory_root)[-1] == "checkpoints/checkpoint_3/state.ckpt"

    resumed.save_state(f"{memory_root}/manual")
    resumed.load_state(f"{memory_root}/manual")
    resumed.save_model(model2, f"{memory_root}/export")
    resumed.save_model(model2, f"{memory_root}/export_bin", safe_serialization=False, max_shard_size=10)
    resumed.save({"note": 1}, f"{memory_root}/note.pt")
    written = files(memory_root)
    assert {"manual/state.ckpt", "export/model.safetensors", "note.pt"} <= set(written)
    assert {"export_bin/pytorch_model.bin.index.json", "export_bin/pytorch_model-00001-of-00002.bin"} <= set(
        written
    )
    from safetensors.torch import load

    with fsspec.open(f"{memory_root}/export/model.safetensors", "rb") as file:
        exported = load(file.read())
    for key, value in expected.items():
        assert torch.equal(exported[key], value)
    with pytest.raises(FileNotFoundError, match="No drivetrain training state in 'memory://"):
        resumed.load_state(f"{memory_root}/nothing")
    assert os.listdir(local_dir) == []


@pytest.mark.parametrize(
    ("build", "setting"),
    [
        (lambda path: dt.Trainer(default_root_dir=path, logger=False), "default_root_dir"),
        (lambda path: ModelCheckpoint(dirpath=path), "dirpath"),
        (lambda path: CSVLogger(save_dir=path), "save_dir"),
        (lambda path: dt.Accelerator(cpu=True, project_dir=path), "project_dir"),
    ],
)
def test_unknown_protocols_and_missing_filesystem_packages_are_reported_where_the_path_is_given(
    build: Any, setting: str, local_dir: Path
) -> None:
    with pytest.raises(
        ValueError, match=r"'nosuchfs://bucket/run' names the storage protocol 'nosuchfs', which fsspec"
    ):
        build("nosuchfs://bucket/run")
    try:
        import gcsfs  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError, match=r"'gs' storage, .*'gcsfs' package.*pip install gcsfs"):
            build("gs://bucket/run")
    assert os.listdir(local_dir) == []


def test_file_urls_are_local_paths(tmp_path: Path, local_dir: Path) -> None:
    io = TorchCheckpointIO()
    io.save_checkpoint({"a": 1}, f"file://{tmp_path}/c.ckpt")
    assert (tmp_path / "c.ckpt").is_file()
    assert io.load_checkpoint(tmp_path / "c.ckpt") == {"a": 1}
    with pytest.raises(TypeError, match="storage_options for remote paths"):
        io.save_checkpoint({"a": 1}, tmp_path / "d.ckpt", storage_options={"anon": True})


def test_trackers_that_need_a_local_folder_refuse_a_remote_one(memory_root: str, local_dir: Path) -> None:
    from drivetrain.loggers import MLFlowLogger, WandbLogger

    with pytest.raises(
        ValueError, match="local SQLite store under save_dir, which cannot live on remote storage"
    ):
        MLFlowLogger(save_dir=f"{memory_root}/mlruns")
    with pytest.raises(ValueError, match="cannot be remote storage"):
        WandbLogger(save_dir=f"{memory_root}/wandb")
    # By name under a remote root: W&B keeps its local staging folder where it would anyway.
    assert dt.Trainer(default_root_dir=memory_root, logger="wandb").logger.save_dir is None
    assert os.listdir(local_dir) == []
