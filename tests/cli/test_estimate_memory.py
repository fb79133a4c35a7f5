"""``drivetrain estimate-memory``: the bytes per process, against numbers added up by hand."""

from __future__ import annotations

import json

import pytest

from drivetrain.cli.main import main

MODEL = "helpers.memory_models:Tiny"
P, F = 220, 105  # trainable, frozen: Linear(10, 20) and a frozen Linear(20, 5)


def _estimates(
    capsys: pytest.CaptureFixture[str], *arguments: str
) -> dict[tuple[str, str], dict[str, float]]:
    assert main(["estimate-memory", MODEL, "--json", *arguments]) == 0
    rows = json.loads(capsys.readouterr().out)
    return {(row["strategy"], row["precision"]): row for row in rows}


def _bytes(row: dict[str, float]) -> tuple[float, float, float, float]:
    return (row["weights"], row["gradients"], row["optimizer"], row["cpu"])


def test_bytes_per_process_follow_the_strategy_and_the_precision(capsys: pytest.CaptureFixture[str]) -> None:
    found = _estimates(
        capsys,
        "-n",
        "4",
        "--strategy",
        "ddp",
        "fsdp",
        "fsdp_cpu_offload",
        "deepspeed_stage_1",
        "deepspeed_stage_2",
        "deepspeed_stage_3",
        "deepspeed_stage_3_offload",
        "--precision",
        "32-true",
        "bf16-mixed",
        "bf16-true",
        "64-true",
    )
    weights32, grads32, adam32 = (P + F) * 4, P * 4, P * 8
    assert _bytes(found["ddp", "32-true"]) == (weights32, grads32, adam32, 0)  # 1300, 880, 1760
    assert _bytes(found["ddp", "bf16-mixed"]) == (weights32, grads32, adam32, 0)  # autocast keeps fp32 state
    assert _bytes(found["ddp", "bf16-true"]) == ((P + F) * 2, P * 2, P * 4, 0)
    assert _bytes(found["ddp", "64-true"]) == ((P + F) * 8, P * 8, P * 16, 0)
    assert _bytes(found["fsdp", "32-true"]) == (1300 / 4, 880 / 4, 1760 / 4, 0)
    assert _bytes(found["fsdp_cpu_offload", "32-true"]) == (0, 0, 0, (1300 + 880 + 1760) / 4)
    # DeepSpeed in 16 bits: 16-bit weights and gradients, fp32 master weights + 2 Adam states (12 bytes).
    assert _bytes(found["deepspeed_stage_1", "bf16-mixed"]) == (650, 440, P * 12 / 4, 0)
    assert _bytes(found["deepspeed_stage_2", "bf16-mixed"]) == (650, 440 / 4, 660, 0)
    assert _bytes(found["deepspeed_stage_3", "bf16-mixed"]) == (650 / 4, 110, 660, 0)
    assert _bytes(found["deepspeed_stage_3_offload", "bf16-mixed"]) == (0, 110, 0, 660 + 650 / 4)
    assert _bytes(found["deepspeed_stage_2", "32-true"]) == (1300, 880 / 4, 1760 / 4, 0)  # no master copy
    assert found["ddp", "32-true"]["device_total"] == 1300 + 880 + 1760


def test_optimizers_and_the_table(capsys: pytest.CaptureFixture[str]) -> None:
    sgd = _estimates(capsys, "--optimizer", "sgd_momentum", "--precision", "32-true")
    assert _bytes(sgd["single_device", "32-true"]) == (1300, 880, 880, 0)
    assert (
        _estimates(capsys, "--optimizer", "sgd", "--precision", "32-true")["single_device", "32-true"][
            "optimizer"
        ]
        == 0
    )
    assert main(["estimate-memory", MODEL, "-n", "2"]) == 0
    text = capsys.readouterr().out
    assert "325 parameters (220 trainable), 2 process(es), adam" in text
    assert "ddp" in text and "deepspeed_stage_3_offload" in text and "single_device" not in text
    assert "1.27 KiB" in text  # ddp 32-true weights: 1300 bytes


def test_a_model_of_any_size_is_built_without_memory(capsys: pytest.CaptureFixture[str]) -> None:
    # Linear(20, 5) frozen; Linear(10, 300_000_000) trainable: 12 GB of fp32 weights, built on meta.
    found = _estimates(capsys, "--init-args", '{"width": 300000000}', "--precision", "bf16-true")
    trainable = 10 * 300_000_000 + 300_000_000
    frozen = 300_000_000 * 5 + 5
    assert _bytes(found["single_device", "bf16-true"]) == (
        (trainable + frozen) * 2,
        trainable * 2,
        trainable * 4,
        0,
    )


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["helpers.memory_models"], "is not MODULE:CLASS"),
        (["no_such_module_here:Net"], "cannot import 'no_such_module_here'"),
        (["helpers.memory_models:Missing"], "has no class or function 'Missing'"),
        (["helpers.memory_models:not_a_module"], "gave a int, not a torch.nn.Module"),
        ([MODEL, "--init-args", "[1]"], "must be a JSON object"),
        ([MODEL, "--init-args", "{oops"], "Expecting property name"),
        ([MODEL, "--precision", "fp4"], "Unknown precision 'fp4'"),
        ([MODEL, "-n", "2", "--strategy", "single_device"], "single_device cannot run on 2 processes"),
    ],
)
def test_bad_input_is_explained(
    arguments: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["estimate-memory", *arguments]) == 2
    assert message in capsys.readouterr().err
