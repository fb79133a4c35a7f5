"""strategy="auto" weighs DDP against FSDP from the model's size and the device's memory.

The estimate is the one ``drivetrain estimate-memory`` prints (weights + gradients + Adam states
per process, from parameter shapes); the limit comes from the hardware accelerator (on CPU:
``CPUAccelerator(memory_limit=...)`` or ``DRIVETRAIN_CPU_MEMORY_LIMIT``).
"""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

import drivetrain as dt
from drivetrain.accelerators import CPUAccelerator
from drivetrain.cli.main import main as cli_main
from drivetrain.connector import auto_strategy_choice, fit_auto_strategy
from drivetrain.strategies import DDPStrategy, FSDPStrategy
from drivetrain.strategies.memory_estimate import choose_data_parallel
from helpers.multiprocess import run_processes
from helpers.scripts import clean_env, run_script

PROGRAM = str(Path(__file__).parent / "auto_sizing_program.py")
# 16 → 1024 → 1: 18,433 parameters; 32-bit weights + gradients + 2 Adam states = 294,928 bytes
# (288.02 KiB) per process under DDP, half of it (144.01 KiB) per process under FSDP on 2.
WIDTH = 1024
DDP_BYTES = 18_433 * 4 * 4


def _meta_model(width: int = WIDTH) -> nn.Module:
    with torch.device("meta"):
        return nn.Sequential(nn.Linear(16, width), nn.Tanh(), nn.Linear(width, 1))


# -- the choice, without processes ----------------------------------------------------------------
def test_choice_from_shapes_on_the_meta_device() -> None:
    model = _meta_model()
    fits = choose_data_parallel(model, "32-true", 2, (DDP_BYTES, "test"), "cpu")
    assert (fits.strategy, fits.ddp.device_total, fits.fsdp.device_total) == ("ddp", DDP_BYTES, DDP_BYTES / 2)
    over = choose_data_parallel(model, "32-true", 2, (DDP_BYTES - 1, "the limit's source"), "cpu")
    assert over.strategy == "fsdp"
    assert over.reason == (
        "strategy='auto' chose FSDP over 2 processes: DDP would hold 288.02 KiB of weights, gradients and Adam "
        "states in 32-true per process, more than the 288.01 KiB of cpu (the limit's source); FSDP shards it "
        "to 144.01 KiB per process."
    )
    still_over = choose_data_parallel(model, "32-true", 2, (1024, "x"), "cpu")
    assert still_over.strategy == "fsdp" and "still over the limit" in still_over.reason
    unknown = choose_data_parallel(model, "32-true", 2, None, "cpu")
    assert unknown.strategy == "ddp" and "no memory limit is known for cpu" in unknown.reason
    # 16-bit weights halve every figure: the same limit now fits DDP.
    assert choose_data_parallel(model, "bf16-true", 2, (DDP_BYTES // 2, "x"), "cpu").strategy == "ddp"


def test_cpu_limit_from_the_argument_or_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    cpu = torch.device("cpu")
    monkeypatch.delenv("DRIVETRAIN_CPU_MEMORY_LIMIT", raising=False)
    assert CPUAccelerator().training_memory(cpu) is None
    assert CPUAccelerator(memory_limit="2KiB").training_memory(cpu) == (
        2048,
        "CPUAccelerator(memory_limit=...)",
    )
    monkeypatch.setenv("DRIVETRAIN_CPU_MEMORY_LIMIT", "1MB")
    assert CPUAccelerator().training_memory(cpu) == (10**6, "DRIVETRAIN_CPU_MEMORY_LIMIT=1MB")
    assert CPUAccelerator(memory_limit=5).training_memory(cpu) == (5, "CPUAccelerator(memory_limit=...)")
    monkeypatch.setenv("DRIVETRAIN_CPU_MEMORY_LIMIT", "lots")
    with pytest.raises(ValueError, match=r"DRIVETRAIN_CPU_MEMORY_LIMIT='lots' is not a size.*'2GiB'"):
        CPUAccelerator().training_memory(cpu)
    with pytest.raises(ValueError, match=r"memory_limit='-1' is not a size"):
        CPUAccelerator(memory_limit="-1")


def test_only_the_ddp_auto_builds_is_resized() -> None:
    model = _meta_model()
    tight = CPUAccelerator(memory_limit=1024)
    single = dt.connect(accelerator=tight)
    assert fit_auto_strategy(single, model) == (single, None)
    chosen = dt.connect(accelerator=tight, strategy="ddp_spawn", devices=2)
    assert auto_strategy_choice(chosen, model) is None  # not a re-run launch: left as it is
    ddp = dt.connect(accelerator=tight, devices=2)
    assert isinstance(ddp, DDPStrategy)
    sharded, choice = fit_auto_strategy(ddp, model)
    assert choice is not None and choice.strategy == "fsdp"
    assert isinstance(sharded, FSDPStrategy)
    assert sharded.accelerator is tight and sharded.precision is ddp.precision
    assert sharded.parallel_devices == ddp.parallel_devices and sharded.world_size == 2
    assert sharded.cluster_environment is ddp.cluster_environment and sharded.timeout == ddp.timeout


# -- whole programs: Trainer(strategy="auto", devices=2) on 2 CPU processes ----------------------
def _run(*arguments: str, limit: str | None = None) -> tuple[list[str], str]:
    env = clean_env(**({"DRIVETRAIN_CPU_MEMORY_LIMIT": limit} if limit else {}))
    result = run_script([PROGRAM, str(WIDTH), *arguments], env=env, timeout=150)
    assert result.returncode == 0, f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    return sorted(line for line in result.stdout.splitlines() if line.startswith("rank=")), result.stderr


@pytest.mark.multiprocess
@pytest.mark.timeout(300)
def test_trainer_picks_fsdp_when_ddp_would_not_fit_and_says_why() -> None:
    over, over_log = _run(limit="200KiB")
    fits, fits_log = _run("1MiB")

    assert [line.split(" sum=")[0] for line in over] == [
        "rank=0 strategy=FSDPStrategy steps=4",
        "rank=1 strategy=FSDPStrategy steps=4",
    ]
    reasons = [line for line in over_log.splitlines() if "strategy='auto'" in line]
    assert reasons == [
        "strategy='auto' chose FSDP over 2 processes: DDP would hold 288.02 KiB of weights, gradients and Adam "
        "states in 32-true per process, more than the 200.00 KiB of cpu (DRIVETRAIN_CPU_MEMORY_LIMIT=200KiB); "
        "FSDP shards it to 144.01 KiB per process."
    ]  # once: rank 0 only

    assert [line.split(" sum=")[0] for line in fits] == [
        "rank=0 strategy=DDPStrategy steps=4",
        "rank=1 strategy=DDPStrategy steps=4",
    ]
    assert re.search(
        r"strategy='auto' chose DDP over 2 processes: 288\.02 KiB .* fits the 1\.00 MiB of cpu "
        r"\(CPUAccelerator\(memory_limit=\.\.\.\)\)\.",
        fits_log,
    )
    # Both strategies train the same model on the same data to the same weights.
    sums = [float(lines[0].rsplit("=", 1)[1]) for lines in (over, fits)]
    assert sums[0] == pytest.approx(sums[1], abs=1e-4)

    # A validate before fit started the DDP processes: fit keeps them rather than start others.
    after_validate, log = _run("-", "validate-first", limit="200KiB")
    assert [line.split(" sum=")[0] for line in after_validate] == [
        "rank=0 strategy=DDPStrategy steps=4",
        "rank=1 strategy=DDPStrategy steps=4",
    ]
    assert "strategy='auto'" not in log
    assert float(after_validate[0].rsplit("=", 1)[1]) == sums[1]


def test_without_a_limit_auto_stays_ddp_and_says_nothing(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.delenv("DRIVETRAIN_CPU_MEMORY_LIMIT", raising=False)
    ddp = dt.connect(accelerator="cpu", devices=2)
    with caplog.at_level("INFO", logger="drivetrain"):
        kept, choice = fit_auto_strategy(ddp, _meta_model())
    assert kept is ddp and choice is not None and choice.limit is None
    assert not [r for r in caplog.records if "strategy='auto'" in r.getMessage()]
    monkeypatch.setenv("DRIVETRAIN_CPU_MEMORY_LIMIT", "1MiB")
    with caplog.at_level("INFO", logger="drivetrain"):
        fit_auto_strategy(ddp, _meta_model())
    assert [r.getMessage() for r in caplog.records if "strategy='auto'" in r.getMessage()] == [
        "strategy='auto' chose DDP over 2 processes: 288.02 KiB of weights, gradients and Adam states in 32-true "
        "per process fits the 1.00 MiB of cpu (DRIVETRAIN_CPU_MEMORY_LIMIT=1MiB)."
    ]


def test_env_explain_reports_the_rule_the_limit_and_the_choice(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DRIVETRAIN_CPU_MEMORY_LIMIT", "200KiB")
    model = "torch.nn:Linear"
    init_args = '{"in_features": 1024, "out_features": 64}'  # 65,600 parameters: 1 MiB under DDP
    assert cli_main(["env", "--explain", "--model", model, "--init-args", init_args, "-n", "4"]) == 0
    out = capsys.readouterr().out
    explained = out.split("How strategy='auto' chooses here:", 1)[1]
    assert "several processes: DDP, unless" in explained
    assert "training memory of cpu: 200.00 KiB (DRIVETRAIN_CPU_MEMORY_LIMIT=200KiB)." in explained
    assert (
        "torch.nn:Linear on 4 processes: strategy='auto' chose FSDP over 4 processes: DDP would hold 1.00 MiB"
        in explained
    )
    assert "FSDP shards it to 256.25 KiB per process. That is still over the limit" in explained

    monkeypatch.delenv("DRIVETRAIN_CPU_MEMORY_LIMIT")
    assert cli_main(["env", "--explain"]) == 0
    assert "not known, so DDP always (on CPU set DRIVETRAIN_CPU_MEMORY_LIMIT=8GiB" in capsys.readouterr().out
    assert cli_main(["env", "--model", model]) == 2
    assert "--model is used with --explain" in capsys.readouterr().err


# -- the Accelerator: built before the model is known, it keeps DDP and says what does not fit ------
def _prepare_under_auto(rank: int, world_size: int, limit: str) -> tuple[str, list[str]]:
    accelerator = dt.Accelerator(accelerator=CPUAccelerator(memory_limit=limit))
    model = nn.Sequential(nn.Linear(16, WIDTH), nn.Tanh(), nn.Linear(WIDTH, 1))
    optimizer = torch.optim.Adam(model.parameters())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model, optimizer = accelerator.prepare(model, optimizer)
        accelerator.prepare(nn.Linear(16, WIDTH))  # only the first model is weighed
    return type(accelerator.strategy).__name__, [str(w.message) for w in caught]


@pytest.mark.multiprocess
def test_accelerator_warns_with_the_figures_when_the_model_does_not_fit_ddp() -> None:
    results = run_processes(_prepare_under_auto, 2, args=("200KiB",), timeout=90)
    expected = (
        "Accelerator(strategy='auto') runs DDP over 2 processes (chosen when it was built, before the model was "
        "known), but DDP would hold 288.02 KiB of weights, gradients and Adam states in 32-true per process, more "
        "than the 200.00 KiB of cpu (CPUAccelerator(memory_limit=...)); FSDP shards it to 144.01 KiB per process. "
        "Pass Accelerator(strategy='fsdp') to shard the model."
    )
    assert results == [("DDPStrategy", [expected])] * 2
    assert run_processes(_prepare_under_auto, 2, args=("1MiB",), timeout=90) == [("DDPStrategy", [])] * 2
