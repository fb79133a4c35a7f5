"""The seeds' Trainer examples as real programs: processes started by re-running the script, spawn and fork."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers.scripts import run_script

SCRIPT = str(Path(__file__).parent / "scripts" / "seed_trainers.py")

pytestmark = pytest.mark.multiprocess


def _run(case: str, root: Path) -> list[str]:
    result = run_script([SCRIPT, case, str(root)], timeout=150)
    assert result.returncode == 0, f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    return sorted(line for line in result.stdout.splitlines() if line)


def test_ddp_on_three_cpu_processes_fit_test_predict(tmp_path: Path) -> None:
    lines = _run("ddp3", tmp_path)
    # 48 samples / 3 ranks / 4 per batch = 4 steps per epoch; test and predict see all 20 samples once.
    assert [line.split(" ", 1)[1] for line in lines] == [lines[0].split(" ", 1)[1]] * 3
    assert [line.split(" ", 1)[0] for line in lines] == ["rank=0", "rank=1", "rank=2"]
    assert "world=3 steps=8 seen=20 predicted=20" in lines[0] and lines[0].endswith("state=finished")


def test_registered_strategy_with_custom_checkpoint_io_on_a_user_accelerator(tmp_path: Path) -> None:
    lines = _run("xpu_custom_io", tmp_path)
    assert lines == [
        "custom-io saved epoch=0.ckpt",
        "custom-io saved epoch=1.ckpt",
        "rank=0 accelerator=XPUAccelerator world=2 steps=12 io=CustomCheckpointIO files=['epoch=1.ckpt']",
        "rank=1 accelerator=XPUAccelerator world=2 steps=12 io=CustomCheckpointIO files=-",
    ]


@pytest.mark.parametrize("start", ["spawn", "fork"])
def test_spawned_ranks_hand_the_trained_model_back(tmp_path: Path, start: str) -> None:
    lines = _run(start, tmp_path)
    expected = [
        "parent same_as_single=True steps=12 epoch=2 finished=True metrics=['loss', 'val_loss'] best=epoch=1.ckpt"
    ]
    if start == "fork":
        expected.append("parent tested=[{'seen': 20.0}]")
    assert lines == expected


def test_the_demo_example_trains_to_a_good_accuracy(tmp_path: Path) -> None:
    example = Path(__file__).parents[2] / "examples" / "trainer_digits.py"
    result = run_script([str(example), "--epochs", "3", "--root", str(tmp_path)], timeout=150)
    assert result.returncode == 0, result.stderr
    last = result.stdout.strip().splitlines()[-1]
    assert last.startswith("final validation accuracy: ")
    assert float(last.rsplit(" ", 1)[1]) > 0.85
    assert "trained on 2 process(es) with DDPStrategy" in result.stdout
    assert "Epoch 2: 100%" in result.stderr
    # Redirected output gets whole lines, not redraws; rank 0 writes them, rank 1 does not.
    assert "\r" not in result.stderr
    assert result.stderr.count("Epoch 0: 100%") == 1, result.stderr


@pytest.mark.parametrize("case", ["ddp1", "custom_ddp1"])
def test_ddp_strategies_run_a_one_process_group_on_one_device(tmp_path: Path, case: str) -> None:
    result = run_script([SCRIPT, case, str(tmp_path)], timeout=150)
    assert result.returncode == 0, f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    lines = [line for line in result.stdout.splitlines() if line]
    # 48 samples in batches of 4, two epochs: the same 24 steps and weights as without a process group.
    if case == "ddp1":
        assert lines == ["world=1 steps=24 same_as_single=True wrapper=DistributedDataParallel"]
        assert "strategy='ddp' with one device runs a process group of one process" in result.stderr
    else:
        assert lines == [
            "world=1 steps=24 same_as_single=True wrapper=CustomDistributedDataParallel",
            "custom-io saved final.ckpt",
            "setup_calls=1 backward_calls=24",
        ]
    assert (tmp_path / "final.ckpt").exists() == (case == "custom_ddp1")
