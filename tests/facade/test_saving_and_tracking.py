"""save, save_model, register_for_checkpointing, and the TensorBoard/CSV trackers."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import torch
from torch import nn

import drivetrain as dt
from drivetrain.loggers import CSVLogger


def test_save_writes_objects_and_state_dicts(tmp_path: Path) -> None:
    accelerator = dt.Accelerator(cpu=True)
    accelerator.save({"step": 3, "w": torch.ones(2)}, tmp_path / "plain.pt")
    loaded = torch.load(tmp_path / "plain.pt", weights_only=True)
    assert loaded["step"] == 3 and torch.equal(loaded["w"], torch.ones(2))
    accelerator.save({"w": torch.ones(2)}, tmp_path / "safe.safetensors", safe_serialization=True)
    from safetensors.torch import load_file

    assert torch.equal(load_file(str(tmp_path / "safe.safetensors"))["w"], torch.ones(2))
    with pytest.raises(TypeError, match="safe_serialization=True writes a dict of tensors"):
        accelerator.save({"step": 3}, tmp_path / "bad.safetensors", safe_serialization=True)


def test_save_model_shards_past_the_limit_and_keeps_tied_weights(tmp_path: Path) -> None:
    accelerator = dt.Accelerator(cpu=True)
    model = nn.Sequential(nn.Embedding(10, 4), nn.Linear(4, 10, bias=False))
    model[1].weight = model[0].weight  # tied: safetensors refuses shared storage unless handled
    model = accelerator.prepare(model)
    accelerator.save_model(model, tmp_path / "one")
    from safetensors.torch import load_file

    single = load_file(str(tmp_path / "one" / "model.safetensors"))
    assert set(single) == {"0.weight", "1.weight"} and torch.equal(single["1.weight"], model[0].weight)
    accelerator.save_model(model, tmp_path / "sharded", max_shard_size=200)  # each weight is 160 bytes
    index = json.loads((tmp_path / "sharded" / "model.safetensors.index.json").read_text())
    assert index["weight_map"] == {
        "0.weight": "model-00001-of-00002.safetensors",
        "1.weight": "model-00002-of-00002.safetensors",
    }
    accelerator.save_model(model, tmp_path / "bin", safe_serialization=False)
    assert set(torch.load(tmp_path / "bin" / "pytorch_model.bin", weights_only=True)) == {
        "0.weight",
        "1.weight",
    }
    with pytest.raises(ValueError, match="max_shard_size='lots' is not a size"):
        accelerator.save_model(model, tmp_path / "x", max_shard_size="lots")


def test_register_for_checkpointing_needs_state_methods() -> None:
    model = torch.nn.Linear(2, 2)
    with pytest.raises(ValueError) as raised:
        dt.Accelerator(cpu=True).register_for_checkpointing(
            torch.tensor([1, 2]), model, 3, torch.optim.SGD(model.parameters(), lr=0.1)
        )
    # Each invalid input listed as Accelerate lists it (programs and its tests look for these lines).
    message = str(raised.value)
    assert "`state_dict` and `load_state_dict`" in message
    assert "\n\t- Item at index 0, `Tensor`" in message and "\n\t- Item at index 2, `int`" in message
    assert "Item at index 1" not in message and "Item at index 3" not in message


def test_trackers_write_tensorboard_and_csv_logs(tmp_path: Path) -> None:
    accelerator = dt.Accelerator(cpu=True, log_with="all", project_dir=tmp_path)
    accelerator.init_trackers("digits", config={"lr": 0.1, "model": {"width": 8}})
    for step in range(3):
        accelerator.log({"loss": torch.tensor(1.0 / (step + 1)), "val": {"acc": 0.5}}, step=step)
    accelerator.end_training()
    csv_logger = accelerator.get_tracker("csv").logger
    assert isinstance(csv_logger, CSVLogger) and Path(csv_logger.log_dir).parent == tmp_path / "digits"
    with open(csv_logger.metrics_file_path) as file:
        rows = list(csv.DictReader(file))
    assert [float(r["loss"]) for r in rows] == pytest.approx([1.0, 0.5, 1 / 3])
    assert [float(r["val/acc"]) for r in rows] == [0.5] * 3
    events = list((tmp_path / "digits").rglob("events.out.tfevents.*"))
    assert events, "TensorBoard event files are written"
    assert "width" in (Path(csv_logger.log_dir) / "hparams.yaml").read_text()


def test_logging_without_trackers_is_not_silent(tmp_path: Path) -> None:
    with pytest.warns(UserWarning, match="records nothing: no tracker is configured"):
        dt.Accelerator(cpu=True).log({"loss": 1.0})
    accelerator = dt.Accelerator(cpu=True, log_with="csv", project_dir=tmp_path)
    with pytest.raises(RuntimeError, match=r"before init_trackers"):
        accelerator.log({"loss": 1.0})
    with pytest.raises(ValueError, match="needs a directory"):
        dt.Accelerator(cpu=True, log_with="tensorboard").init_trackers("run")
    with pytest.raises(ValueError, match="Options were given for 'tensorboard'"):
        accelerator.init_trackers("run", init_kwargs={"tensorboard": {}})


def test_a_logger_instance_is_used_as_a_tracker(tmp_path: Path) -> None:
    logger = CSVLogger(tmp_path, name="mine", flush_logs_every_n_steps=1)
    accelerator = dt.Accelerator(cpu=True, log_with=[logger])
    accelerator.init_trackers("ignored-for-instances")
    accelerator.log({"loss": 2.0}, step=0)
    assert accelerator.get_tracker("csv").logger is logger
    assert Path(logger.metrics_file_path).read_text().splitlines()[1].split(",").count("2.0") == 1
