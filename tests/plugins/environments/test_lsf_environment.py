"""LSFEnvironment: jsrun's variables and LSF's host lists (faked; there is no LSF here)."""

from __future__ import annotations

import socket

import pytest

from drivetrain.plugins.environments import LSFEnvironment
from drivetrain.plugins.environments._environ import port_from_job_id

# Rank 7 of `jsrun -r 4` on two compute hosts; `batch1` is the launch node.
JSRUN = {
    "LSB_JOBID": 777,
    "JSM_NAMESPACE_SIZE": 8,
    "JSM_NAMESPACE_RANK": 7,
    "JSM_NAMESPACE_LOCAL_RANK": 3,
}


@pytest.fixture
def rankfile(tmp_path):
    path = tmp_path / "rankfile"
    # One line per slot; the launch node first, with its single slot.
    path.write_text("batch1\n" + "h01n01\n" * 4 + "h01n02\n" * 4)
    return path


@pytest.fixture
def jsrun(setenv, rankfile, monkeypatch):
    setenv(**JSRUN, LSB_DJOB_RANKFILE=rankfile)
    monkeypatch.setattr(socket, "gethostname", lambda: "h01n02")
    return LSFEnvironment()


def test_values_come_from_jsrun_and_the_rankfile(jsrun):
    assert jsrun.creates_processes_externally is True
    assert jsrun.compute_hosts() == ["h01n01", "h01n02"]
    assert jsrun.main_address == "h01n01"
    assert jsrun.world_size() == 8
    assert jsrun.global_rank() == 7
    assert jsrun.local_rank() == 3
    assert jsrun.node_rank() == 1


def test_hosts_from_mcpu_hosts_when_no_rankfile(jsrun, monkeypatch):
    monkeypatch.delenv("LSB_DJOB_RANKFILE")
    monkeypatch.setenv("LSB_MCPU_HOSTS", "batch2 1 a01 42 a02 42 a03 42")
    assert jsrun.compute_hosts() == ["a01", "a02", "a03"]
    assert jsrun.main_address == "a01"


def test_node_rank_matches_short_and_qualified_host_names(jsrun, monkeypatch):
    monkeypatch.setattr(socket, "gethostname", lambda: "h01n02.summit.olcf.ornl.gov")
    assert jsrun.node_rank() == 1


def test_node_rank_when_lsf_lists_ip_addresses(jsrun, monkeypatch):
    # All addresses share their first octet: comparing "short names" would match the first host.
    monkeypatch.setenv("LSB_MCPU_HOSTS", "10.10.10.9 1 10.10.10.1 4 10.10.10.2 4")
    monkeypatch.delenv("LSB_DJOB_RANKFILE")
    monkeypatch.setattr(socket, "gethostname", lambda: "10.10.10.2")
    assert jsrun.compute_hosts() == ["10.10.10.1", "10.10.10.2"]
    assert jsrun.node_rank() == 1
    assert jsrun.main_address == "10.10.10.1"


def test_node_rank_finds_this_machine_by_its_address(jsrun, monkeypatch):
    # The host reports a name while LSF lists addresses: the one assigned to this machine is ours
    # (203.0.113.0/24 is reserved for documentation: no machine has it).
    monkeypatch.setenv("LSB_MCPU_HOSTS", "batch1 1 203.0.113.7 4 127.0.0.1 4")
    monkeypatch.delenv("LSB_DJOB_RANKFILE")
    monkeypatch.setattr(socket, "gethostname", lambda: "h01n02")
    assert jsrun.node_rank() == 1
    monkeypatch.setenv("LSB_MCPU_HOSTS", "batch1 1 203.0.113.7 4 203.0.113.8 4")
    with pytest.raises(
        ValueError, match=r"cannot find this host 'h01n02' among .*'203.0.113.7', '203.0.113.8'"
    ):
        jsrun.node_rank()


def test_an_address_never_matches_a_name_by_its_first_label(jsrun, monkeypatch):
    monkeypatch.setenv("LSB_MCPU_HOSTS", "batch1 1 10.0.0.1 4 10 4")
    monkeypatch.delenv("LSB_DJOB_RANKFILE")
    monkeypatch.setattr(socket, "gethostname", lambda: "10.cluster.org")
    assert jsrun.node_rank() == 1


def test_node_rank_of_a_host_outside_the_job(jsrun, monkeypatch):
    monkeypatch.setattr(socket, "gethostname", lambda: "login3")
    with pytest.raises(
        ValueError,
        match=r"cannot find this host 'login3' among the job's compute hosts \['h01n01', 'h01n02'\]",
    ):
        jsrun.node_rank()


def test_main_port_from_the_job_id_or_master_port(jsrun, setenv):
    assert jsrun.main_port == port_from_job_id("777") == 13804
    setenv(MASTER_PORT=29400, MASTER_ADDR="h01n01-ib")
    assert jsrun.main_port == 29400
    assert jsrun.main_address == "h01n01-ib"


def test_validate_settings_accepts_the_job(jsrun):
    jsrun.validate_settings(num_devices=4, num_nodes=2)


def test_validate_settings_nodes_disagree(jsrun):
    with pytest.raises(ValueError) as error:
        jsrun.validate_settings(num_devices=4, num_nodes=1)
    assert str(error.value) == (
        "The LSF job has 2 compute host(s) but num_nodes=1. Pass num_nodes=2, or request 1 node(s) with "
        "`#BSUB -nnodes 1`."
    )


def test_validate_settings_devices_disagree(jsrun):
    with pytest.raises(ValueError) as error:
        jsrun.validate_settings(num_devices=2, num_nodes=2)
    assert str(error.value) == (
        "jsrun started 8 process(es) in all (JSM_NAMESPACE_SIZE=8) but devices=2 on num_nodes=2 needs 4. "
        "Launch 2 per host (e.g. `jsrun -r 2`), or pass devices=<processes per host>."
    )


def test_validate_settings_uses_the_local_size_when_jsrun_gives_it(jsrun, setenv):
    setenv(JSM_NAMESPACE_LOCAL_SIZE=6)
    with pytest.raises(
        ValueError, match=r"jsrun started 6 process\(es\) per host \(JSM_NAMESPACE_LOCAL_SIZE=6\)"
    ):
        jsrun.validate_settings(num_devices=4, num_nodes=2)


def test_setters_accept_jsruns_values_and_refuse_others(jsrun):
    jsrun.set_world_size(8)
    jsrun.set_global_rank(7)
    with pytest.raises(ValueError, match=r"Cannot set the world size to 2: .*JSM_NAMESPACE_SIZE=8"):
        jsrun.set_world_size(2)
    with pytest.raises(ValueError, match=r"Cannot set the global rank to 1: .*JSM_NAMESPACE_RANK=7"):
        jsrun.set_global_rank(1)


@pytest.mark.parametrize(
    "value",
    ["batch1 1 a01", "batch1 one a01 42", "batch1 1 a01 0"],
)
def test_malformed_mcpu_hosts(jsrun, monkeypatch, value):
    monkeypatch.delenv("LSB_DJOB_RANKFILE")
    monkeypatch.setenv("LSB_MCPU_HOSTS", value)
    with pytest.raises(ValueError, match=r"LSB_MCPU_HOSTS="):
        jsrun.compute_hosts()


def test_unreadable_rankfile(jsrun, monkeypatch, tmp_path):
    monkeypatch.setenv("LSB_DJOB_RANKFILE", str(tmp_path / "missing"))
    with pytest.raises(ValueError, match=r"Cannot read LSB_DJOB_RANKFILE="):
        jsrun.compute_hosts()


def test_rankfile_with_only_the_launch_node(jsrun, rankfile):
    rankfile.write_text("batch1\n")
    with pytest.raises(ValueError, match=r"found only the launch node \['batch1'\]"):
        jsrun.compute_hosts()


def test_no_host_source(jsrun, monkeypatch):
    monkeypatch.delenv("LSB_DJOB_RANKFILE")
    with pytest.raises(ValueError, match=r"needs LSB_DJOB_RANKFILE or LSB_MCPU_HOSTS"):
        _ = jsrun.main_address


def test_garbled_rank(jsrun, setenv):
    setenv(JSM_NAMESPACE_RANK="seven")
    with pytest.raises(ValueError, match=r"JSM_NAMESPACE_RANK='seven' is not an integer"):
        jsrun.global_rank()


def test_repr(jsrun):
    assert repr(jsrun) == (
        "LSFEnvironment(world_size=8, global_rank=7, local_rank=3, node_rank=1, main_address='h01n01', "
        "main_port=13804)"
    )
