"""The strategy registry as Lightning users read it: dict-style entries, Lightning's preset names, suggestions."""

from __future__ import annotations

from typing import Any

import pytest

import drivetrain as dt
from drivetrain.accelerators import AcceleratorRegistry, CPUAccelerator
from drivetrain.plugins import TorchCheckpointIO
from drivetrain.strategies import DDPStrategy, StrategyRegistry

# Lightning 2.x registers every way of starting DDP processes plain and with
# find_unused_parameters set either way: twelve names.
DDP_PRESETS = {
    f"{base}{suffix}": (start_method, unused)
    for base, start_method in (
        ("ddp", "popen"),
        ("ddp_spawn", "spawn"),
        ("ddp_fork", "fork"),
        ("ddp_notebook", "fork"),
    )
    for suffix, unused in (
        ("", None),
        ("_find_unused_parameters_true", True),
        ("_find_unused_parameters_false", False),
    )
}


@pytest.mark.parametrize(("name", "expected"), sorted(DDP_PRESETS.items()))
def test_every_lightning_ddp_preset_builds_what_its_name_says(name: str, expected: tuple[str, Any]) -> None:
    start_method, unused = expected
    strategy = dt.connect(accelerator="cpu", strategy=name, devices=2)
    assert type(strategy) is DDPStrategy
    assert strategy.start_method == start_method
    assert strategy.ddp_kwargs.get("find_unused_parameters") == unused


def test_entries_read_like_lightnings_dicts() -> None:
    entry = StrategyRegistry["ddp_spawn_find_unused_parameters_false"]
    assert entry["strategy"] is DDPStrategy
    assert entry["strategy_name"] == "ddp_spawn_find_unused_parameters_false"
    assert entry["init_params"] == {"start_method": "spawn", "find_unused_parameters": False}
    assert entry["description"] == "'ddp_spawn' that expects every parameter to get a gradient."
    assert set(entry) == {"strategy", "strategy_name", "description", "init_params"}
    cpu = AcceleratorRegistry["cpu"]
    assert (cpu["accelerator"], cpu["accelerator_name"], dict(cpu["init_params"])) == (
        CPUAccelerator,
        "cpu",
        {},
    )
    assert set(cpu) == {"accelerator", "accelerator_name", "description", "init_params"}

    # Read-only: the registry changes through register()/remove() only.
    with pytest.raises(TypeError):
        entry["init_params"]["start_method"] = "fork"  # type: ignore[index]
    with pytest.raises(TypeError):
        entry["strategy"] = object  # type: ignore[index]
    assert (
        StrategyRegistry["ddp_spawn_find_unused_parameters_false"]["init_params"]["start_method"] == "spawn"
    )

    assert StrategyRegistry.keys() == StrategyRegistry.available_strategies()
    assert "ddp_notebook_find_unused_parameters_true" in StrategyRegistry
    assert dict(StrategyRegistry.items())["fsdp"]["strategy"].__name__ == "FSDPStrategy"
    assert [view["strategy_name"] for view in StrategyRegistry.values()] == StrategyRegistry.keys()


def test_a_users_preset_reads_back_with_its_init_params() -> None:
    io = TorchCheckpointIO()
    StrategyRegistry.register(
        "ddp_custom_checkpoint_io", DDPStrategy, description="with my IO", checkpoint_io=io
    )
    assert StrategyRegistry["ddp_custom_checkpoint_io"]["init_params"]["checkpoint_io"] is io
    assert dt.connect(accelerator="cpu", strategy="ddp_custom_checkpoint_io", devices=2).checkpoint_io is io


def test_unknown_names_are_key_and_value_errors_with_the_closest_match() -> None:
    # KeyError for dict-style code written against Lightning's registries, ValueError as every
    # bad input here; the message is a sentence, not KeyError's quoted repr.
    with pytest.raises(KeyError) as error:
        StrategyRegistry["ddp_spwan"]
    assert isinstance(error.value, ValueError)
    assert str(error.value).startswith(
        "Unknown strategy 'ddp_spwan'. Did you mean 'ddp_spawn'? Available: ddp,"
    )
    with pytest.raises(ValueError, match=r"Unknown strategy 'quantum'\. Available: ddp"):
        StrategyRegistry.get("quantum")
    sentinel = object()
    assert StrategyRegistry.get("quantum", sentinel) is sentinel  # Lightning's get(name, default)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"strategy": "dpp"}, r"Unknown strategy 'dpp'\. Did you mean 'ddp'\? Available: ddp,"),
        ({"strategy": "deepspeed_stage3"}, r"Did you mean 'deepspeed_stage_3'\?"),
        ({"strategy": "DDP_Spawn"}, r"Did you mean 'ddp_spawn'\?"),
        ({"accelerator": "cpo"}, r"Unknown accelerator 'cpo'\. Did you mean 'cpu'\? Available: cpu,"),
        ({"precision": "bf16_mixed"}, r"Unknown precision 'bf16_mixed'\. Did you mean 'bf16-mixed'\?"),
    ],
)
def test_both_front_doors_suggest_the_closest_name(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        dt.Trainer(**kwargs)
    with pytest.raises(ValueError, match=message):
        dt.Accelerator(**kwargs)


def test_no_suggestion_when_nothing_is_close() -> None:
    with pytest.raises(ValueError) as error:
        dt.Trainer(strategy="quantum_annealing")
    assert "Did you mean" not in str(error.value)
