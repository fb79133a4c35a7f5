"""SLURMEnvironment and the host-list parsing it relies on (SLURM itself is faked by its variables)."""

from __future__ import annotations

import random
import re

import pytest

from drivetrain.plugins.environments import SLURMEnvironment
from drivetrain.plugins.environments._environ import port_from_job_id
from drivetrain.plugins.environments._hostlist import expand_hostlist, expand_tasks_per_node

# What srun gives task 5 of `sbatch --nodes=2 --ntasks-per-node=4` + `srun python train.py`.
SRUN = {
    "SLURM_JOB_ID": 12345,
    "SLURM_JOB_NAME": "train",
    "SLURM_NTASKS": 8,
    "SLURM_NNODES": 2,
    "SLURM_NTASKS_PER_NODE": 4,
    "SLURM_TASKS_PER_NODE": "4(x2)",
    "SLURM_PROCID": 5,
    "SLURM_LOCALID": 1,
    "SLURM_NODEID": 1,
    "SLURM_JOB_NODELIST": "gpu[007-008]",
    "SLURM_NODELIST": "gpu[007-008]",
}


def _read(environment, name):
    """A getter's value, whether it is a method or a property."""
    value = getattr(environment, name)
    return value() if callable(value) else value


@pytest.fixture
def srun(setenv):
    setenv(**SRUN)
    return SLURMEnvironment()


@pytest.mark.parametrize(
    ("expression", "hosts"),
    [
        ("node1", ["node1"]),
        ("node[1-3]", ["node1", "node2", "node3"]),
        (
            "node[001-003,007],gpu-a[1-2],login",
            ["node001", "node002", "node003", "node007", "gpu-a1", "gpu-a2", "login"],
        ),
        ("n[8-10]", ["n8", "n9", "n10"]),
        ("n[08-10]", ["n08", "n09", "n10"]),
        ("rack[1-2]-n[1-2]", ["rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"]),
        ("a[3],b,c[5,1]", ["a3", "b", "c5", "c1"]),
        ("host-1.cluster.org,host-2.cluster.org", ["host-1.cluster.org", "host-2.cluster.org"]),
        (" node[1-2] ", ["node1", "node2"]),
        # Separators as SLURM's own parser takes them: commas, spaces, tabs; empty entries skipped.
        ("alpha beta\tgamma", ["alpha", "beta", "gamma"]),
        ("alpha, beta,,gamma", ["alpha", "beta", "gamma"]),
        # Whitespace inside brackets is not SLURM's, but must not break the list (nor the padding).
        ("1.2.3.[089, 100-102]", ["1.2.3.089", "1.2.3.100", "1.2.3.101", "1.2.3.102"]),
        ("n[ 1 - 2 ,07]", ["n1", "n2", "n07"]),
        ("10.0.0.[1-2],10.0.1.5", ["10.0.0.1", "10.0.0.2", "10.0.1.5"]),
    ],
)
def test_expand_hostlist(expression, hosts):
    assert expand_hostlist(expression) == hosts


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("", r"The SLURM host list '' names no host"),
        (" ,\t", r"names no host"),
        ("node[1-2", r"Unclosed '\[' in the host list 'node\[1-2'"),
        ("node1-2]", r"Unbalanced '\]'"),
        ("node[[1]]", r"Nested brackets"),
        ("node[a-b]", r"Invalid range 'a-b' in the host list 'node\[a-b\]'"),
        ("node[]", r"Invalid range ''"),
        ("node[3-1]", r"Descending range '3-1'"),
        ("node[1,,2]", r"Invalid range ''"),
        ("node[1 2]", r"Invalid range '1 2'"),
    ],
)
def test_expand_hostlist_rejects_malformed_lists(expression, message):
    with pytest.raises(ValueError, match=message):
        expand_hostlist(expression)


@pytest.mark.parametrize(
    ("value", "counts"),
    [("4", [4]), ("2(x3)", [2, 2, 2]), ("2(x3),1", [2, 2, 2, 1]), ("1,3(x2)", [1, 3, 3])],
)
def test_expand_tasks_per_node(value, counts):
    assert expand_tasks_per_node("SLURM_TASKS_PER_NODE", value) == counts


@pytest.mark.parametrize("value", ["", "x", "2(3)", "2(x)", "-1"])
def test_expand_tasks_per_node_rejects_garbage(value):
    with pytest.raises(
        ValueError, match=re.escape(f"SLURM_TASKS_PER_NODE={value!r} is not a SLURM task count")
    ):
        expand_tasks_per_node("SLURM_TASKS_PER_NODE", value)


def test_values_come_from_srun(srun):
    assert srun.creates_processes_externally is True
    assert srun.world_size() == 8
    assert srun.global_rank() == 5
    assert srun.local_rank() == 1
    assert srun.node_rank() == 1
    assert srun.num_nodes() == 2
    assert srun.tasks_per_node() == 4
    assert srun.main_address == "gpu007"
    assert srun.uses_agent_store is False


def test_main_address_prefers_the_step_node_list_and_master_addr(srun, setenv):
    setenv(SLURM_STEP_NODELIST="gpu[008]")
    assert srun.main_address == "gpu008"
    setenv(MASTER_ADDR="gpu007-ib")
    assert srun.main_address == "gpu007-ib"


def test_main_address_falls_back_to_slurm_nodelist(srun, monkeypatch):
    monkeypatch.delenv("SLURM_JOB_NODELIST")
    monkeypatch.setenv("SLURM_NODELIST", "cn[10-11]")
    assert srun.main_address == "cn10"
    monkeypatch.delenv("SLURM_NODELIST")
    with pytest.raises(ValueError, match=r"needs the node list.*Set MASTER_ADDR"):
        _ = srun.main_address


@pytest.mark.parametrize(
    ("nodelist", "first"),
    [("1.2.3.[089, 100-110]", "1.2.3.089"), ("alpha beta gamma", "alpha"), ("alpha, beta", "alpha")],
)
def test_main_address_from_node_lists_with_spaces(srun, setenv, nodelist, first):
    setenv(SLURM_JOB_NODELIST=nodelist)
    assert srun.main_address == first


def test_expand_hostlist_agrees_with_python_hostlist():
    """Random expressions in the grammar both parsers take give the same hosts in the same order."""
    hostlist = pytest.importorskip("hostlist")
    rng = random.Random(0)
    for _ in range(300):
        items = []
        for _ in range(rng.randint(1, 4)):
            item = rng.choice(["n", "gpu-", "rack", "10.1.", "a.b"])
            for _ in range(rng.randint(0, 2)):
                ranges = []
                for _ in range(rng.randint(1, 3)):
                    low = rng.randint(0, 12)
                    width = rng.choice([1, 2, 3])
                    piece = str(low).zfill(width)
                    if rng.random() < 0.5:
                        piece += "-" + str(low + rng.randint(0, 3)).zfill(width)
                    ranges.append(piece)
                item += "[" + ",".join(ranges) + "]" + rng.choice(["", "x", "-ib"])
            items.append(item)
        expression = ",".join(items)
        assert expand_hostlist(expression) == hostlist.expand_hostlist(expression, allow_duplicates=True), (
            expression
        )


def test_main_port_is_derived_from_the_job_id_identically_everywhere(srun, setenv):
    # Pinned: every task (and any script that wants the port) computes 10000 + crc32(id) % 22768.
    assert srun.main_port == 30556 == port_from_job_id("12345")
    setenv(SLURM_PROCID=0, SLURM_NODEID=0, SLURM_LOCALID=0)
    assert SLURMEnvironment().main_port == 30556


def test_main_port_depends_on_the_step_and_can_be_overridden(srun, setenv):
    setenv(SLURM_STEP_ID=0)
    assert srun.main_port == 26101
    setenv(SLURM_STEP_ID=1)
    assert srun.main_port == 26979
    setenv(MASTER_PORT=29555)
    assert srun.main_port == 29555


def test_main_port_without_a_job_id(srun, monkeypatch):
    monkeypatch.delenv("SLURM_JOB_ID")
    with pytest.raises(ValueError, match=r"derives the rendezvous port from SLURM_JOB_ID.*Set MASTER_PORT"):
        _ = srun.main_port


@pytest.mark.parametrize("job_id", ["1", "99999999", "4242_7", "array-17", "x" * 100])
def test_derived_ports_stay_in_the_documented_range(job_id):
    assert 10000 <= port_from_job_id(job_id) <= 32767


def test_derived_ports_spread_over_consecutive_job_ids():
    ports = {port_from_job_id(str(job_id)) for job_id in range(1000, 1100)}
    assert len(ports) >= 95


def test_tasks_per_node_sources_in_order(srun, setenv, monkeypatch):
    setenv(SLURM_STEP_TASKS_PER_NODE="3(x2)")
    assert srun.tasks_per_node() == 3
    monkeypatch.delenv("SLURM_STEP_TASKS_PER_NODE")
    monkeypatch.delenv("SLURM_NTASKS_PER_NODE")
    setenv(SLURM_TASKS_PER_NODE="2(x2)")
    assert srun.tasks_per_node() == 2
    monkeypatch.delenv("SLURM_TASKS_PER_NODE")
    assert srun.tasks_per_node() == 4  # SLURM_NTASKS // SLURM_NNODES


def test_tasks_per_node_uneven(srun, setenv, monkeypatch):
    setenv(SLURM_TASKS_PER_NODE="3,2")
    monkeypatch.delenv("SLURM_NTASKS_PER_NODE")
    with pytest.raises(ValueError) as error:
        srun.tasks_per_node()
    assert str(error.value) == (
        "SLURM spread the tasks unevenly over the nodes (SLURM_TASKS_PER_NODE=3,2); every node must run the "
        "same number of processes. Request it with #SBATCH --ntasks-per-node=<devices per node>."
    )
    monkeypatch.delenv("SLURM_TASKS_PER_NODE")
    setenv(SLURM_NTASKS=5)
    with pytest.raises(ValueError, match=r"unevenly over the nodes \(SLURM_NTASKS=5 on 2 node\(s\)\)"):
        srun.tasks_per_node()


def test_num_nodes_prefers_the_step(srun, setenv, monkeypatch):
    setenv(SLURM_STEP_NUM_NODES=1)
    assert srun.num_nodes() == 1
    monkeypatch.delenv("SLURM_STEP_NUM_NODES")
    monkeypatch.delenv("SLURM_NNODES")
    setenv(SLURM_JOB_NUM_NODES=3)
    assert srun.num_nodes() == 3
    monkeypatch.delenv("SLURM_JOB_NUM_NODES")
    with pytest.raises(ValueError, match=r"expected one of SLURM_STEP_NUM_NODES, SLURM_NNODES"):
        srun.num_nodes()


def test_validate_settings_accepts_the_allocation(srun):
    srun.validate_settings(num_devices=4, num_nodes=2)


def test_validate_settings_devices_disagree(srun):
    with pytest.raises(ValueError) as error:
        srun.validate_settings(num_devices=2, num_nodes=2)
    assert str(error.value) == (
        "SLURM started 4 task(s) per node but devices=2. Set `#SBATCH --ntasks-per-node=2` (and the same on "
        "`srun` if you pass it there), or pass devices=4."
    )


def test_validate_settings_nodes_disagree(srun):
    with pytest.raises(ValueError) as error:
        srun.validate_settings(num_devices=4, num_nodes=1)
    assert str(error.value) == (
        "SLURM allocated 2 node(s) but num_nodes=1. Pass num_nodes=2, or set `#SBATCH --nodes=1`."
    )


def test_setters_accept_slurms_values_and_refuse_others(srun):
    srun.set_world_size(8)
    srun.set_global_rank(5)
    with pytest.raises(ValueError, match=r"Cannot set the world size to 4: .*\(SLURM_NTASKS=8\)"):
        srun.set_world_size(4)
    with pytest.raises(ValueError, match=r"Cannot set the global rank to 1: .*\(SLURM_PROCID=5\)"):
        srun.set_global_rank(1)


@pytest.mark.parametrize(
    ("name", "value", "getter", "message"),
    [
        ("SLURM_NTASKS", "four", "world_size", r"SLURM_NTASKS='four' is not an integer"),
        ("SLURM_PROCID", "-2", "global_rank", r"SLURM_PROCID='-2' is out of range"),
        ("SLURM_LOCALID", "", "local_rank", r"SLURM_LOCALID='' is not an integer"),
        ("SLURM_NODEID", "n1", "node_rank", r"SLURM_NODEID='n1' is not an integer"),
        ("SLURM_NTASKS_PER_NODE", "4x", "tasks_per_node", r"SLURM_NTASKS_PER_NODE='4x' is not a SLURM task"),
        ("SLURM_JOB_NODELIST", "gpu[1-", "main_address", r"Unclosed '\[' in the host list 'gpu\[1-'"),
    ],
)
def test_garbled_variables(srun, setenv, name, value, getter, message):
    setenv(**{name: value})
    with pytest.raises(ValueError, match=message):
        _read(srun, getter)


def test_repr(srun):
    assert repr(srun) == (
        "SLURMEnvironment(world_size=8, global_rank=5, local_rank=1, node_rank=1, main_address='gpu007', "
        "main_port=30556, job_id='12345')"
    )
