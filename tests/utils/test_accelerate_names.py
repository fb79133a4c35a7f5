"""Names Accelerate programs import from ``accelerate.utils`` (and ``accelerate.data_loader``,
``accelerate.local_sgd``), with the behaviour those programs rely on."""

from __future__ import annotations

import collections
import json
import os
import sys
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.data import BatchSampler, SequentialSampler

import drivetrain as dt
from drivetrain import utils
from helpers.scripts import clean_env, run_command


def test_model_file_constants_are_what_save_model_writes(tmp_path: Path) -> None:
    accelerator = dt.Accelerator(cpu=True)
    model = accelerator.prepare(nn.Linear(4, 4))
    accelerator.save_model(model, tmp_path / "one")
    assert os.listdir(tmp_path / "one") == [utils.SAFE_WEIGHTS_NAME]
    accelerator.save_model(model, tmp_path / "shards", max_shard_size=40, safe_serialization=False)
    files = sorted(os.listdir(tmp_path / "shards"))
    assert files == [
        utils.WEIGHTS_PATTERN_NAME.format(suffix="-00001-of-00002"),
        utils.WEIGHTS_PATTERN_NAME.format(suffix="-00002-of-00002"),
        utils.WEIGHTS_INDEX_NAME,
    ]
    assert (utils.SAFE_WEIGHTS_INDEX_NAME, utils.WEIGHTS_NAME) == (
        "model.safetensors.index.json",
        "pytorch_model.bin",
    )


def test_availability_helpers_answer_without_importing() -> None:
    assert utils.is_rocm_available() is False  # a CPU build of torch
    assert (
        utils.is_torchao_available() is True and utils.is_fp8_available() is True
    )  # the dev extra has torchao
    assert utils.is_schedulefree_available() is False and utils.is_comet_ml_available() is False
    assert utils.is_torchdata_stateful_dataloader_available() is False
    assert "comet_ml" not in sys.modules and "schedulefree" not in sys.modules


def test_environment_helpers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KEEP_ME", "1")
    with utils.clear_environment():
        assert "KEEP_ME" not in os.environ
        os.environ["ONLY_INSIDE"] = "x"
    assert os.environ["KEEP_ME"] == "1" and "ONLY_INSIDE" not in os.environ

    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "bf16")

    @utils.purge_accelerate_environment
    def configure() -> None:
        os.environ["ACCELERATE_MIXED_PRECISION"] = "fp16"
        os.environ["ACCELERATE_USE_CPU"] = "true"
        os.environ["DRIVETRAIN_PRECISION"] = "16-mixed"

    configure()
    assert os.environ["ACCELERATE_MIXED_PRECISION"] == "bf16"
    assert "ACCELERATE_USE_CPU" not in os.environ and "DRIVETRAIN_PRECISION" not in os.environ

    @utils.purge_accelerate_environment
    class Cases:
        def test_sets(self) -> None:
            os.environ["ACCELERATE_DEBUG_MODE"] = "1"

    class More(Cases):
        def test_sets_too(self) -> None:
            os.environ["ACCELERATE_GRADIENT_ACCUMULATION_STEPS"] = "4"

    More().test_sets()
    More().test_sets_too()
    assert "ACCELERATE_DEBUG_MODE" not in os.environ
    assert "ACCELERATE_GRADIENT_ACCUMULATION_STEPS" not in os.environ


def test_nested_data_helpers() -> None:
    Pair = collections.namedtuple("Pair", "x y")
    data = {
        "a": [torch.ones(2, dtype=torch.float16), "label"],
        "b": Pair(torch.zeros(1, dtype=torch.bfloat16), 3),
    }
    converted = utils.convert_to_fp32(data)
    assert converted["a"][0].dtype == torch.float32 and converted["a"][1] == "label"
    assert (
        isinstance(converted["b"], Pair) and converted["b"].x.dtype == torch.float32 and converted["b"].y == 3
    )
    doubled = utils.recursively_apply(lambda t, k: t * k, {"t": (torch.ones(2),)}, 2)
    assert torch.equal(doubled["t"][0], torch.full((2,), 2.0))
    with pytest.raises(TypeError, match="found a str"):
        utils.recursively_apply(lambda t: t, [torch.ones(1), "x"], error_on_other_type=True)
    batches = [{"x": torch.ones(2, 3)}, {"x": torch.zeros(2, 3)}]
    assert utils.concatenate(batches)["x"].shape == (4, 3)
    assert utils.concatenate(batches, dim=1)["x"].shape == (2, 6)
    assert utils.concatenate([batches[0]]) is batches[0]


def test_skip_batch_sampler_and_skip_data_loader() -> None:
    batches = BatchSampler(SequentialSampler(range(10)), batch_size=3, drop_last=False)
    skipping = utils.SkipBatchSampler(batches, skip_batches=2)
    assert list(skipping) == [[6, 7, 8], [9]] and len(skipping) == 2 and skipping.total_length == 4
    loader = utils.SkipDataLoader(list(range(10)), skip_batches=3, batch_size=3)
    assert [batch.tolist() for batch in loader] == [[9]] and len(loader) == 1
    with pytest.raises(ValueError, match="skip_batches must be an int >= 0"):
        utils.SkipBatchSampler(batches, skip_batches=-1)


def test_local_sgd_refuses_sharded_strategies_and_does_nothing_on_one_process() -> None:
    accelerator = dt.Accelerator(cpu=True)
    model = accelerator.prepare(nn.Linear(2, 1))
    with utils.LocalSGD(accelerator, model, local_sgd_steps=2) as local_sgd:
        local_sgd.step()
    assert not local_sgd.enabled and local_sgd.num_steps == 1
    with pytest.raises(ValueError, match="local_sgd_steps must be an int >= 1"):
        utils.LocalSGD(accelerator, model, local_sgd_steps=0)


@pytest.mark.multiprocess
def test_local_sgd_averages_the_weights_every_k_steps(tmp_path: Path) -> None:
    script = Path(__file__).parent / "local_sgd_script.py"
    completed = run_command(
        [sys.executable, "-m", "drivetrain", "launch", "-n", "2", "--cpu", str(script), str(tmp_path)],
        env=clean_env(),
        timeout=180,
    )
    assert completed.returncode == 0, completed.stderr
    ranks = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    # Steps 1 and 3 are local (different data: the weights part), 2 and 4 end with an average.
    assert ranks[0][0] != ranks[1][0] and ranks[0][2] != ranks[1][2]
    assert ranks[0][1] == ranks[1][1] and ranks[0][3] == ranks[1][3]
