"""KubeflowEnvironment: one process per pod of a PyTorchJob (faked by the operator's variables)."""

from __future__ import annotations

import pytest

from drivetrain.plugins.environments import KubeflowEnvironment

POD = {
    "KUBERNETES_PORT": "tcp://10.96.0.1:443",
    "MASTER_ADDR": "mnist-master-0",
    "MASTER_PORT": 23456,
    "WORLD_SIZE": 3,
    "RANK": 2,
}


@pytest.fixture
def pod(setenv):
    setenv(**POD)
    return KubeflowEnvironment()


def test_values_come_from_the_operator(pod):
    assert pod.creates_processes_externally is True
    assert pod.main_address == "mnist-master-0"
    assert pod.main_port == 23456
    assert pod.world_size() == 3
    assert pod.global_rank() == 2
    assert pod.local_rank() == 0
    assert pod.node_rank() == 2


def test_validate_settings_accepts_one_device_per_pod(pod):
    pod.validate_settings(num_devices=1, num_nodes=3)


def test_validate_settings_devices_must_be_one(pod):
    with pytest.raises(ValueError) as error:
        pod.validate_settings(num_devices=2, num_nodes=3)
    assert str(error.value) == (
        "Kubeflow PyTorchJob starts one process per pod, but devices=2. Set devices=1, or run torchrun "
        "inside the pod (an elastic PyTorchJob) to use several devices per pod."
    )


def test_validate_settings_nodes_must_be_the_pod_count(pod):
    with pytest.raises(ValueError) as error:
        pod.validate_settings(num_devices=1, num_nodes=2)
    assert str(error.value) == (
        "The PyTorchJob runs 3 pod(s) (WORLD_SIZE=3) but num_nodes=2. Pass num_nodes=3, or change the job's "
        "Master + Worker replica counts to 2."
    )


def test_setters_accept_the_operators_values_and_refuse_others(pod):
    pod.set_world_size(3)
    pod.set_global_rank(2)
    with pytest.raises(
        ValueError, match=r"Cannot set the world size to 6: .*WORLD_SIZE=3, set by the PyTorchJob"
    ):
        pod.set_world_size(6)
    with pytest.raises(ValueError, match=r"Cannot set the global rank to 0: .*RANK=2"):
        pod.set_global_rank(0)


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("RANK", "two", r"RANK='two' is not an integer"),
        ("MASTER_PORT", "http", r"MASTER_PORT='http' is not an integer"),
        ("WORLD_SIZE", "0", r"WORLD_SIZE='0' is out of range"),
        (
            "MASTER_ADDR",
            "",
            r"expected the environment variable MASTER_ADDR to hold a value, but it is empty",
        ),
    ],
)
def test_garbled_variables(pod, setenv, name, value, message):
    setenv(**{name: value})
    with pytest.raises(ValueError, match=message):
        _ = (pod.world_size(), pod.global_rank(), pod.main_port, pod.main_address)


def test_repr(pod):
    assert repr(pod) == (
        "KubeflowEnvironment(world_size=3, global_rank=2, local_rank=0, node_rank=2, "
        "main_address='mnist-master-0', main_port=23456)"
    )
