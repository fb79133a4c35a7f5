"""examples/lightning_style_blobs.py, a Lightning program with only its imports changed, on 1 and 2 processes.

Each run is a real program start: a fit with validation twice per epoch, accumulation and clipping,
test and predict with ckpt_path="best", then a second start that resumes with ckpt_path="last".
What the runs claim is checked against the files they wrote: the best checkpoint holds weights
whose validation loss is the score in its name, the resumed run starts at the step and learning
rate where the first one stopped. The same file runs on real Lightning (EXAMPLE_FRAMEWORK=lightning);
that comparison was made by hand and is not part of the suite.
"""

from __future__ import annotations

import csv
import importlib.util
import json
from pathlib import Path

import pytest
import torch
from torch import nn

from helpers.scripts import run_script

EXAMPLE = Path(__file__).parents[2] / "examples" / "lightning_style_blobs.py"


def _example_module():
    spec = importlib.util.spec_from_file_location("lightning_style_blobs", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open() as f:
        return list(csv.DictReader(f))


# Two real program starts (fresh, then resumed), each up to 240 s on a loaded machine.
@pytest.mark.timeout(2 * 240 + 30)
@pytest.mark.parametrize("processes", [1, pytest.param(2, marks=pytest.mark.multiprocess)])
def test_the_lightning_example_fits_tests_predicts_and_resumes(tmp_path: Path, processes: int) -> None:
    example = _example_module()
    data = example.Blobs()
    data.setup("fit")
    launch = [str(EXAMPLE), "--root", str(tmp_path), "--quiet", "--devices", str(processes)]
    if processes > 1:
        launch += ["--strategy", "ddp"]

    def run(*extra: str) -> dict:
        result = run_script([*launch, *extra], timeout=240)
        assert result.returncode == 0, result.stderr
        summary = json.loads((tmp_path / "summary.json").read_text())[-1]
        _check_checkpoints_test_and_predict(example, data, summary)  # before the next run prunes its files
        return summary

    trained = run()
    resumed = run("--resume", "--max-epochs", "5")

    # 512 training points in batches of 16 shared by the processes, two batches per optimizer step.
    steps_per_epoch = 512 // 16 // processes // 2
    assert trained["world_size"] == resumed["world_size"] == processes
    assert trained["fit"] == {"global_step": 3 * steps_per_epoch, "epoch": 3}
    if not resumed["stopped_early"]:
        assert resumed["fit"] == {"global_step": 5 * steps_per_epoch, "epoch": 5}

    # last.ckpt now holds the end of the resumed run; that run started where the first one stopped
    # (its first logged step, and the learning rate after three epochs of halving).
    last = torch.load(resumed["last_model_path"], weights_only=True)
    assert last["global_step"] == resumed["fit"]["global_step"]
    first_rows, resumed_rows = _rows(Path(trained["metrics_file"])), _rows(Path(resumed["metrics_file"]))
    assert trained["metrics_file"] != resumed["metrics_file"]
    for rows in (first_rows, resumed_rows):
        assert {"train_loss", "val_loss", "val_acc", "lr-Adam", "test_acc"} <= set(rows[0])
        assert all(row["epoch"] != "" for row in rows)
        assert sum(row["val_loss"] != "" for row in rows) >= 2
    learning_rates = [(int(r["step"]), float(r["lr-Adam"])) for r in resumed_rows if r["lr-Adam"]]
    assert learning_rates[0] == (trained["fit"]["global_step"], pytest.approx(0.05 * 0.5**3))
    assert min(int(r["step"]) for r in resumed_rows) == trained["fit"]["global_step"]


def _check_checkpoints_test_and_predict(example, data, run: dict) -> None:
    """Every kept checkpoint holds the weights its score was measured on; test and predict used the best."""
    points, labels = data.val_set.tensors
    assert Path(run["last_model_path"]).is_file()
    assert run["best_model_path"] in run["best_k_models"] and len(run["best_k_models"]) == 2
    for path, score in run["best_k_models"].items():
        assert f"val_loss={score:.4f}" in Path(path).name
        model = example.BlobClassifier()
        model.load_state_dict(torch.load(path, weights_only=True)["state_dict"])
        with torch.no_grad():
            assert nn.functional.cross_entropy(model(points), labels).item() == pytest.approx(score, abs=1e-5)
    assert run["best_model_score"] == min(run["best_k_models"].values())
    best = example.BlobClassifier()
    best.load_state_dict(torch.load(run["best_model_path"], weights_only=True)["state_dict"])
    test_points, test_labels = data.test_set.tensors
    with torch.no_grad():
        accuracy = (best(test_points).argmax(1) == test_labels).float().mean().item()
        predicted = best(data.predict_set.tensors[0]).argmax(1).tolist()
    assert run["test"]["test_acc"] == pytest.approx(accuracy, abs=1e-6)
    assert run["predicted_labels"] == predicted  # the whole prediction set, once, in order
