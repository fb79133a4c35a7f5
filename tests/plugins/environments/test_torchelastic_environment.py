"""TorchElasticEnvironment: reading torchrun's variables (faked here; a real torchrun run is in
test_environment_launches.py)."""

from __future__ import annotations

import pytest

from drivetrain.plugins.environments import TorchElasticEnvironment

TORCHRUN = {
    "TORCHELASTIC_RUN_ID": "a1b2",
    "TORCHELASTIC_USE_AGENT_STORE": "True",
    "RANK": 5,
    "LOCAL_RANK": 1,
    "WORLD_SIZE": 8,
    "GROUP_RANK": 2,
    "LOCAL_WORLD_SIZE": 2,
    "MASTER_ADDR": "node0",
    "MASTER_PORT": 29500,
}


def _read(environment, name):
    """A getter's value, whether it is a method or a property."""
    value = getattr(environment, name)
    return value() if callable(value) else value


@pytest.fixture
def torchrun(setenv):
    setenv(**TORCHRUN)
    return TorchElasticEnvironment()


def test_values_come_from_torchrun(torchrun):
    assert torchrun.creates_processes_externally is True
    assert torchrun.main_address == "node0"
    assert torchrun.main_port == 29500
    assert torchrun.world_size() == 8
    assert torchrun.global_rank() == 5
    assert torchrun.local_rank() == 1
    assert torchrun.node_rank() == 2
    assert torchrun.uses_agent_store is True


@pytest.mark.parametrize(
    ("value", "expected"), [("True", True), ("False", False), ("true", False), (None, False)]
)
def test_uses_agent_store_follows_torchrun_spelling(torchrun, monkeypatch, value, expected):
    if value is None:
        monkeypatch.delenv("TORCHELASTIC_USE_AGENT_STORE")
    else:
        monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", value)
    assert torchrun.uses_agent_store is expected


def test_setters_accept_torchruns_values_and_refuse_others(torchrun):
    torchrun.set_world_size(8)
    torchrun.set_global_rank(5)
    with pytest.raises(ValueError) as error:
        torchrun.set_world_size(4)
    assert str(error.value) == (
        "Cannot set the world size to 4: the launcher fixed it at 8 (WORLD_SIZE=8, set by torchrun). "
        "Relaunch torchrun with --nnodes and --nproc-per-node that multiply to it."
    )
    with pytest.raises(ValueError, match=r"Cannot set the global rank to 0: the launcher fixed it at 5"):
        torchrun.set_global_rank(0)
    assert torchrun.world_size() == 8


def test_validate_settings_accepts_the_launched_layout(torchrun):
    torchrun.validate_settings(num_devices=2, num_nodes=4)


def test_validate_settings_devices_disagree(torchrun):
    with pytest.raises(ValueError) as error:
        torchrun.validate_settings(num_devices=4, num_nodes=4)
    assert str(error.value) == (
        "torchrun started 2 processes per node (--nproc-per-node=2) but devices=4; pass devices=2 "
        "(or devices='auto'), or relaunch with --nproc-per-node=4."
    )


def test_validate_settings_nodes_disagree(torchrun):
    with pytest.raises(ValueError) as error:
        torchrun.validate_settings(num_devices=2, num_nodes=1)
    assert str(error.value) == (
        "torchrun started 4 node(s) (WORLD_SIZE=8 / --nproc-per-node=2) but num_nodes=1; pass num_nodes=4, "
        "or relaunch with --nnodes=1."
    )


def test_validate_settings_uneven_world(torchrun, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "7")
    with pytest.raises(ValueError, match=r"WORLD_SIZE=7, which is not a multiple of LOCAL_WORLD_SIZE=2"):
        torchrun.validate_settings(num_devices=2, num_nodes=4)


def test_master_port_zero_explains_the_static_rendezvous_pitfall(torchrun, monkeypatch):
    monkeypatch.setenv("MASTER_PORT", "0")
    with pytest.raises(ValueError, match=r"torchrun set MASTER_PORT=0.*torchrun --standalone"):
        _ = torchrun.main_port


@pytest.mark.parametrize(
    ("name", "getter"),
    [
        ("MASTER_ADDR", "main_address"),
        ("MASTER_PORT", "main_port"),
        ("WORLD_SIZE", "world_size"),
        ("RANK", "global_rank"),
        ("LOCAL_RANK", "local_rank"),
        ("GROUP_RANK", "node_rank"),
    ],
)
def test_missing_variables_are_named(torchrun, monkeypatch, name, getter):
    monkeypatch.delenv(name)
    with pytest.raises(
        ValueError, match=rf"TorchElasticEnvironment \(torchrun\) expected the environment variable {name}"
    ):
        _read(torchrun, getter)


def test_missing_local_world_size_is_named_by_validate_settings(torchrun, monkeypatch):
    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    with pytest.raises(ValueError, match=r"LOCAL_WORLD_SIZE to be set"):
        torchrun.validate_settings(num_devices=2, num_nodes=4)


@pytest.mark.parametrize(
    ("name", "value", "getter"),
    [("RANK", "abc", "global_rank"), ("GROUP_RANK", "x1", "node_rank"), ("MASTER_PORT", "port", "main_port")],
)
def test_garbled_variables(torchrun, monkeypatch, name, value, getter):
    monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=rf"{name}='{value}' is not an integer"):
        _read(torchrun, getter)


def test_repr(torchrun):
    assert repr(torchrun) == (
        "TorchElasticEnvironment(world_size=8, global_rank=5, local_rank=1, node_rank=2, "
        "main_address='node0', main_port=29500, uses_agent_store=True)"
    )
