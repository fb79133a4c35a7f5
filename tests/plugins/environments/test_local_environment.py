"""LocalEnvironment: a free machine, and the children of drivetrain's own launcher."""

from __future__ import annotations

import pytest

from drivetrain.plugins.environments import LocalEnvironment

CHILD = {
    "LOCAL_RANK": 1,
    "RANK": 3,
    "NODE_RANK": 1,
    "WORLD_SIZE": 4,
    "LOCAL_WORLD_SIZE": 2,
    "MASTER_ADDR": "10.1.2.3",
    "MASTER_PORT": 41000,
}


def _read(environment, name):
    """A getter's value, whether it is a method or a property."""
    value = getattr(environment, name)
    return value() if callable(value) else value


def test_defaults_on_a_bare_machine():
    environment = LocalEnvironment()
    assert environment.creates_processes_externally is False
    assert environment.main_address == "127.0.0.1"
    assert environment.main_port == 0
    assert environment.world_size() == 1
    assert environment.global_rank() == 0
    assert environment.local_rank() == 0
    assert environment.node_rank() == 0
    assert environment.uses_agent_store is False


def test_setters_record_what_the_launcher_decides():
    environment = LocalEnvironment()
    environment.set_world_size(4)
    environment.set_global_rank(2)
    environment.set_main_port(45678)
    assert (environment.world_size(), environment.global_rank(), environment.main_port) == (4, 2, 45678)


def test_two_instances_do_not_share_state():
    first, second = LocalEnvironment(), LocalEnvironment()
    first.set_world_size(8)
    first.set_main_port(45678)
    assert second.world_size() == 1
    assert second.main_port == 0


def test_a_launched_child_reads_its_place_from_the_variables(setenv):
    setenv(**CHILD)
    environment = LocalEnvironment()
    assert environment.creates_processes_externally is True
    assert environment.main_address == "10.1.2.3"
    assert environment.main_port == 41000
    assert environment.world_size() == 4
    assert environment.global_rank() == 3
    assert environment.local_rank() == 1
    assert environment.node_rank() == 1
    # The strategy's own arithmetic agrees with the launcher, so setting is accepted.
    environment.set_world_size(4)
    environment.set_global_rank(3)


def test_local_rank_alone_means_processes_were_created_externally(setenv):
    setenv(LOCAL_RANK=0)
    assert LocalEnvironment().creates_processes_externally is True


def test_a_launcher_hosted_store_is_joined_by_rank_0_too(setenv):
    # notebook_launcher hosts the rendezvous itself and says so with torchrun's variable.
    setenv(**CHILD, TORCHELASTIC_USE_AGENT_STORE="True")
    assert LocalEnvironment().uses_agent_store is True
    setenv(TORCHELASTIC_USE_AGENT_STORE="False")
    assert LocalEnvironment().uses_agent_store is False


def test_node_rank_prefers_node_rank_then_group_rank(setenv, monkeypatch):
    setenv(GROUP_RANK=2)
    assert LocalEnvironment().node_rank() == 2
    setenv(NODE_RANK=5)
    assert LocalEnvironment().node_rank() == 5


def test_master_port_wins_over_set_main_port(setenv):
    setenv(MASTER_PORT=41000)
    environment = LocalEnvironment()
    environment.set_main_port(41000)
    assert environment.main_port == 41000
    with pytest.raises(ValueError, match=r"Cannot set the main port to 41001: MASTER_PORT=41000 is set"):
        environment.set_main_port(41001)


@pytest.mark.parametrize("port", [0, -1, 65536, "41000", True, 4.0])
def test_set_main_port_rejects_non_ports(port):
    with pytest.raises(ValueError, match=r"set_main_port expects a TCP port between 1 and 65535, got"):
        LocalEnvironment().set_main_port(port)


def test_setters_reject_values_contradicting_the_variables(setenv):
    setenv(**CHILD)
    environment = LocalEnvironment()
    with pytest.raises(
        ValueError, match=r"Cannot set the world size to 8: the launcher fixed it at 4 \(WORLD_SIZE=4\)"
    ):
        environment.set_world_size(8)
    with pytest.raises(
        ValueError, match=r"Cannot set the global rank to 0: the launcher fixed it at 3 \(RANK=3\)"
    ):
        environment.set_global_rank(0)


@pytest.mark.parametrize(("method", "value"), [("set_world_size", 0), ("set_global_rank", -1)])
def test_setters_reject_impossible_values(method, value):
    with pytest.raises(ValueError, match=r"must be an integer"):
        getattr(LocalEnvironment(), method)(value)


def test_validate_settings_without_a_launcher_accepts_anything():
    LocalEnvironment().validate_settings(num_devices=8, num_nodes=3)


def test_validate_settings_matching_the_launcher(setenv):
    setenv(**CHILD)
    LocalEnvironment().validate_settings(num_devices=2, num_nodes=2)


def test_validate_settings_devices_disagree(setenv):
    setenv(**CHILD)
    with pytest.raises(ValueError) as error:
        LocalEnvironment().validate_settings(num_devices=4, num_nodes=2)
    assert str(error.value) == (
        "The launcher started 2 processes per node (LOCAL_WORLD_SIZE=2) but devices=4. Pass devices=2, "
        "or relaunch with 4 processes per node."
    )


def test_validate_settings_nodes_disagree(setenv):
    setenv(**CHILD)
    with pytest.raises(ValueError) as error:
        LocalEnvironment().validate_settings(num_devices=2, num_nodes=1)
    assert str(error.value) == (
        "The launcher started 4 processes in all (WORLD_SIZE=4), 2 per node, i.e. on 2 node(s), but "
        "num_nodes=1. Pass num_nodes=2, or relaunch on 1 node(s)."
    )


def test_validate_settings_world_size_not_a_multiple(setenv):
    setenv(**{**CHILD, "WORLD_SIZE": 5})
    with pytest.raises(ValueError, match=r"WORLD_SIZE=5 is not a multiple of LOCAL_WORLD_SIZE=2"):
        LocalEnvironment().validate_settings(num_devices=2, num_nodes=2)


@pytest.mark.parametrize(
    ("name", "value", "getter", "message"),
    [
        ("RANK", "abc", "global_rank", r"RANK='abc' is not an integer"),
        ("WORLD_SIZE", "0", "world_size", r"WORLD_SIZE='0' is out of range; it must be >= 1"),
        ("LOCAL_RANK", "-1", "local_rank", r"LOCAL_RANK='-1' is out of range"),
        ("NODE_RANK", "1.5", "node_rank", r"NODE_RANK='1.5' is not an integer"),
        (
            "MASTER_PORT",
            "99999",
            "main_port",
            r"MASTER_PORT='99999' is out of range; it must be between 1 and 65535",
        ),
        ("MASTER_PORT", "", "main_port", r"MASTER_PORT='' is not an integer"),
    ],
)
def test_garbled_variables_name_the_variable_and_value(setenv, name, value, getter, message):
    setenv(**{name: value})
    environment = LocalEnvironment()
    with pytest.raises(ValueError, match=message):
        _read(environment, getter)


def test_repr_shows_the_facts_and_survives_garbled_variables(setenv):
    setenv(**CHILD)
    assert repr(LocalEnvironment()) == (
        "LocalEnvironment(world_size=4, global_rank=3, local_rank=1, node_rank=1, "
        "main_address='10.1.2.3', main_port=41000)"
    )
    setenv(RANK="abc")
    assert "global_rank='<invalid>'" in repr(LocalEnvironment())
