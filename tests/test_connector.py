"""connect(): strings and instances resolved into a fully wired Strategy, and every bad combination."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import drivetrain as dt
from drivetrain.accelerators import Accelerator, CPUAccelerator, CUDAAccelerator
from drivetrain.plugins import (
    AsyncCheckpointIO,
    CheckpointIO,
    DoublePrecision,
    LocalEnvironment,
    MixedPrecision,
    Precision,
    TorchCheckpointIO,
    TorchElasticEnvironment,
)
from drivetrain.strategies import DDPStrategy, SingleDeviceStrategy, StrategyRegistry


@pytest.fixture
def two_fake_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a, **k: "Fake T4")


@pytest.fixture
def torchrun_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in {
        "TORCHELASTIC_RUN_ID": "abc",
        "RANK": "1",
        "LOCAL_RANK": "1",
        "WORLD_SIZE": "4",
        "LOCAL_WORLD_SIZE": "2",
        "GROUP_RANK": "0",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "29500",
    }.items():
        monkeypatch.setenv(name, value)


def test_defaults_give_a_wired_single_device_strategy() -> None:
    strategy = dt.connect()
    assert isinstance(strategy, SingleDeviceStrategy)
    assert isinstance(strategy.accelerator, CPUAccelerator)
    assert type(strategy.precision) is Precision and strategy.precision.name == "32-true"
    assert isinstance(strategy.checkpoint_io, TorchCheckpointIO)
    assert strategy.root_device == torch.device("cpu")


def test_auto_with_several_devices_is_ddp_with_the_devices_and_environment() -> None:
    strategy = dt.connect(accelerator="cpu", devices=3)
    assert type(strategy) is DDPStrategy and strategy.start_method == "popen"
    assert strategy.parallel_devices == [torch.device("cpu")] * 3
    assert isinstance(strategy.cluster_environment, LocalEnvironment)
    assert (strategy.world_size, strategy.global_rank, strategy.num_processes) == (3, 0, 3)


def test_strings_and_aliases_resolve(two_fake_gpus: None) -> None:
    strategy = dt.connect(accelerator="gpu", strategy="ddp_spawn", devices="0,1", precision="fp16")
    assert isinstance(strategy.accelerator, CUDAAccelerator)
    assert strategy.parallel_devices == [torch.device("cuda", 0), torch.device("cuda", 1)]
    assert isinstance(strategy.precision, MixedPrecision) and strategy.precision.name == "16-mixed"
    assert strategy.start_method == "spawn"
    assert strategy.process_group_backend == "nccl"


def test_plugins_are_sorted_by_type() -> None:
    io, environment = AsyncCheckpointIO(), LocalEnvironment()
    strategy = dt.connect(accelerator="cpu", devices=2, plugins=[io, "64-true", environment])
    assert strategy.checkpoint_io is io
    assert strategy.cluster_environment is environment
    assert isinstance(strategy.precision, DoublePrecision)
    io.teardown()


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"accelerator": "quantum"}, ValueError, r"Unknown accelerator 'quantum'. Available: cpu, cuda"),
        (
            {"strategy": "dpp"},
            ValueError,
            r"Unknown strategy 'dpp'. Did you mean 'ddp'\? Available: ddp, ddp_find_unused",
        ),
        ({"precision": "fp13"}, ValueError, r"fp13"),
        ({"num_nodes": 0}, ValueError, r"num_nodes=0 is not allowed.*num_nodes>=1"),
        ({"num_nodes": 1.5}, TypeError, r"num_nodes= expects an int"),
        ({"devices": 2.0}, TypeError, r"devices= expects 'auto', a number"),
        ({"accelerator": CPUAccelerator}, TypeError, r"pass an instance"),
        ({"strategy": DDPStrategy}, TypeError, r"pass an instance: strategy=DDPStrategy\(\)"),
        ({"strategy": 3}, TypeError, r"strategy= expects a registered name or a Strategy instance, got int"),
        ({"plugins": [object()]}, TypeError, r"plugins= got <object.*Accepted: Precision, CheckpointIO"),
        ({"plugins": ["ddp"]}, ValueError, r"only precision names are accepted there"),
        ({"plugins": [CPUAccelerator()]}, TypeError, r"pass it as accelerator= instead"),
        ({"accelerator": "cuda"}, ValueError, r"accelerator='cuda' was requested but is not available here"),
        (
            {"accelerator": "cpu", "strategy": "single_device", "devices": 2},
            ValueError,
            r"strategy='single_device' runs a single process, but the job has 2 processes",
        ),
        ({"accelerator": "cpu", "devices": -1}, ValueError, r"-1"),
        ({"accelerator": "cpu", "devices": [0, 1]}, ValueError, r"\[0, 1\]"),
    ],
)
def test_bad_settings_are_clear_errors(kwargs: dict[str, Any], error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        dt.connect(**kwargs)


def test_components_given_twice_are_errors() -> None:
    with pytest.raises(
        ValueError, match=r"precision is given twice: .* by plugins= and '64-true' by precision="
    ):
        dt.connect(precision="64-true", plugins=[DoublePrecision()])
    with pytest.raises(ValueError, match=r"checkpoint io is given twice"):
        dt.connect(
            strategy=SingleDeviceStrategy(checkpoint_io=TorchCheckpointIO()), plugins=[TorchCheckpointIO()]
        )
    with pytest.raises(ValueError, match=r"accelerator is given twice"):
        dt.connect(accelerator="cpu", strategy=SingleDeviceStrategy(accelerator=CPUAccelerator()))
    StrategyRegistry.register("ddp_with_io", DDPStrategy, checkpoint_io=TorchCheckpointIO())
    with pytest.raises(ValueError, match=r"by the registered strategy 'ddp_with_io'"):
        dt.connect(accelerator="cpu", devices=2, strategy="ddp_with_io", plugins=[AsyncCheckpointIO()])


def test_devices_beyond_what_exists(two_fake_gpus: None) -> None:
    with pytest.raises(ValueError, match=r"2"):
        dt.connect(accelerator="cuda", devices=[0, 2])
    with pytest.raises(ValueError, match=r"3"):
        dt.connect(accelerator="cuda", devices=3)


def test_precision_the_device_cannot_do(two_fake_gpus: None) -> None:
    with pytest.raises(ValueError, match=r"bf16"):
        dt.connect(accelerator="cuda", devices=1, precision="bf16-mixed")


def test_settings_that_disagree_with_torchrun(torchrun_env: None) -> None:
    with pytest.raises(ValueError, match=r"torchrun started 2 processes per node.*devices=4"):
        dt.connect(accelerator="cpu", devices=4)
    with pytest.raises(
        ValueError, match=r"already started them. Use a strategy without start_method='spawn'"
    ):
        dt.connect(accelerator="cpu", strategy="ddp_spawn")


def test_under_torchrun_auto_takes_the_launchers_layout(torchrun_env: None) -> None:
    strategy = dt.connect(accelerator="cpu")
    assert type(strategy) is DDPStrategy
    assert isinstance(strategy.cluster_environment, TorchElasticEnvironment)
    assert (strategy.num_processes, strategy.num_nodes, strategy.world_size) == (2, 2, 4)
    assert (strategy.global_rank, strategy.local_rank) == (1, 1)


def test_a_strategy_instance_keeps_its_own_components() -> None:
    class MyAccelerator(CPUAccelerator):
        pass

    class MyPrecision(Precision):
        pass

    accelerator, precision = MyAccelerator(), MyPrecision()
    strategy = dt.connect(
        strategy=DDPStrategy(accelerator=accelerator, precision_plugin=precision), devices=2
    )
    assert strategy.accelerator is accelerator
    assert strategy.precision is precision


CPU = torch.device("cpu")


def test_a_strategys_own_devices_must_match_the_accelerator(hardware: Any) -> None:
    hardware.cuda(2)
    with pytest.raises(
        ValueError,
        match=r"DDPStrategy\(\.\.\.\) was built with the devices \[cpu, cpu\], but the accelerator is "
        r"CUDAAccelerator, whose devices are 'cuda' devices\. Use accelerator='cpu'",
    ):
        dt.connect(accelerator="cuda", strategy=DDPStrategy(parallel_devices=[CPU, CPU]))
    with pytest.raises(
        ValueError, match=r"SingleDeviceStrategy\(\.\.\.\) was built with the devices \[cuda:1\]"
    ):
        dt.connect(accelerator="cpu", strategy=SingleDeviceStrategy(device="cuda:1"))
    # The public front door refuses it at construction, as connect() does.
    with pytest.raises(
        ValueError, match=r"built with the devices \[cpu\], but the accelerator is CUDAAccelerator"
    ):
        dt.Trainer(accelerator="gpu", strategy=SingleDeviceStrategy(device="cpu"))


def test_a_strategys_own_devices_choose_the_accelerator_and_the_process_count(hardware: Any) -> None:
    hardware.cuda(2)
    # "auto" would pick CUDA here; the strategy's devices say CPU, and how many processes.
    strategy = dt.connect(strategy=DDPStrategy(parallel_devices=[CPU, CPU]))
    assert isinstance(strategy.accelerator, CPUAccelerator)
    assert strategy.parallel_devices == [CPU, CPU] and strategy.world_size == 2
    single = dt.connect(strategy=SingleDeviceStrategy(device="cuda:1"))
    assert isinstance(single.accelerator, CUDAAccelerator) and single.root_device == torch.device("cuda", 1)
    cuda = dt.connect(
        accelerator="gpu",
        devices=[1, 0],
        strategy=DDPStrategy(parallel_devices=[torch.device("cuda", 1), torch.device("cuda", 0)]),
    )
    assert cuda.parallel_devices == [torch.device("cuda", 1), torch.device("cuda", 0)]


def test_a_strategys_own_devices_must_match_devices(hardware: Any) -> None:
    hardware.cuda(2)
    with pytest.raises(
        ValueError, match=r"built with the devices \[cpu, cpu\], but devices=3 asks for \[cpu, cpu, cpu\]"
    ):
        dt.connect(accelerator="cpu", devices=3, strategy=DDPStrategy(parallel_devices=[CPU, CPU]))
    with pytest.raises(
        ValueError, match=r"built with the devices \[cuda:0, cuda:1\], but devices=\[1, 0\] asks"
    ):
        dt.connect(
            accelerator="cuda",
            devices=[1, 0],
            strategy=DDPStrategy(parallel_devices=[torch.device("cuda", 0), torch.device("cuda", 1)]),
        )
    assert (
        dt.connect(accelerator="cpu", devices=2, strategy=DDPStrategy(parallel_devices=[CPU, CPU])).world_size
        == 2
    )


class OwnIOStrategy(SingleDeviceStrategy):
    """Keeps its checkpoint IO its own way, and says so through the public given_plugins()."""

    def __init__(self, io: CheckpointIO) -> None:
        super().__init__()
        self.own_io = io

    @property
    def checkpoint_io(self) -> CheckpointIO:
        return self.own_io

    def given_plugins(self) -> dict[str, Any]:
        return {**super().given_plugins(), "checkpoint_io": self.own_io}


def test_connect_asks_a_strategy_which_plugins_it_holds_through_given_plugins() -> None:
    own = TorchCheckpointIO()
    strategy = dt.connect(accelerator="cpu", strategy=OwnIOStrategy(own))
    assert strategy.checkpoint_io is own
    # A second checkpoint IO would be silently ignored by the strategy: connect() refuses it.
    with pytest.raises(ValueError, match=r"checkpoint io is given twice: .* by the OwnIOStrategy instance"):
        dt.connect(accelerator="cpu", strategy=OwnIOStrategy(own), plugins=[TorchCheckpointIO()])


def test_given_plugins_with_an_unknown_kind_is_a_clear_error() -> None:
    class Odd(SingleDeviceStrategy):
        def given_plugins(self) -> dict[str, Any]:
            return {"launcher": object()}

    with pytest.raises(
        TypeError, match=r"Odd.given_plugins\(\) must return a dict with keys among accelerator"
    ):
        dt.connect(accelerator="cpu", strategy=Odd())


class FakeXPULib:
    """Stands in for the seed's hypothetical ``xpulib``."""

    @staticmethod
    def available_devices() -> int:
        return 4

    @staticmethod
    def is_available() -> bool:
        return True


xpulib = FakeXPULib()


def test_the_seed_custom_accelerator_works_by_name_and_replaces_the_builtin() -> None:
    with pytest.warns(UserWarning, match="replaces the built-in accelerator 'xpu'"):

        class XPUAccelerator(Accelerator):
            """Support for a hypothetical XPU, optimized for large-scale machine learning."""

            @staticmethod
            def parse_devices(devices: Any) -> Any:
                return devices

            @staticmethod
            def get_parallel_devices(devices: Any) -> Any:
                return [torch.device("cpu", idx) for idx in devices]  # the fake XPU is the CPU

            @staticmethod
            def auto_device_count() -> int:
                return xpulib.available_devices()

            @staticmethod
            def is_available() -> bool:
                return xpulib.is_available()

            def get_device_stats(self, device: Any) -> dict[str, Any]:
                return {}

            @classmethod
            def register_accelerators(cls, accelerator_registry: Any) -> None:
                accelerator_registry.register(
                    "xpu", cls, description="XPU Accelerator - optimized for large-scale machine learning."
                )

    strategy = dt.connect(accelerator="xpu", devices=2)
    assert type(strategy.accelerator) is XPUAccelerator
    assert type(strategy) is DDPStrategy and len(strategy.parallel_devices) == 2
    assert len(dt.connect(accelerator="xpu", strategy="ddp").parallel_devices) == 4  # devices="auto"


def test_drivetrain_launch_accelerator_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DRIVETRAIN_ACCELERATOR", "cpu")
    assert isinstance(dt.connect().accelerator, CPUAccelerator)
    assert isinstance(dt.connect(accelerator="cpu").accelerator, CPUAccelerator)
    monkeypatch.setenv("DRIVETRAIN_ACCELERATOR", "cuda")
    with pytest.raises(
        ValueError, match=r"drivetrain launch --accelerator cuda .* disagrees with accelerator='cpu'"
    ):
        dt.connect(accelerator="cpu")


# -- options for what connect() builds from a name ------------------------------------------------------


def test_strategy_options_reach_the_strategy_built_from_a_name() -> None:
    strategy = dt.connect(
        accelerator="cpu", strategy="ddp", devices=2, strategy_options={"static_graph": True, "timeout": 9}
    )
    assert isinstance(strategy, DDPStrategy) and strategy.ddp_kwargs == {"static_graph": True}
    assert strategy.timeout.total_seconds() == 9
    auto = dt.connect(accelerator="cpu", devices=2, strategy_options={"find_unused_parameters": True})
    assert isinstance(auto, DDPStrategy) and auto.ddp_kwargs == {"find_unused_parameters": True}
    preset = dt.connect(
        accelerator="cpu", strategy="ddp_spawn", devices=2, strategy_options={"process_group_backend": "gloo"}
    )
    assert (preset.start_method, preset.process_group_backend) == ("spawn", "gloo")


def test_strategy_options_have_nothing_to_do_in_one_process_under_auto() -> None:
    strategy = dt.connect(accelerator="cpu", devices=1, strategy_options={"static_graph": True})
    assert isinstance(strategy, SingleDeviceStrategy)


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        (
            {
                "strategy": "ddp_find_unused_parameters_true",
                "strategy_options": {"find_unused_parameters": False},
            },
            ValueError,
            r"strategy='ddp_find_unused_parameters_true' sets find_unused_parameters=True, but strategy_options set "
            r"find_unused_parameters=False\. Set them once\.",
        ),
        (
            {"strategy": "ddp", "strategy_options": {"bucket_size": 3}},
            TypeError,
            r"registered strategy 'ddp' \(DDPStrategy\) with strategy_options \['bucket_size'\]: DDPStrategy got "
            r"unknown argument\(s\) 'bucket_size'",
        ),
        (
            {"strategy": DDPStrategy(), "strategy_options": {"static_graph": True}},
            ValueError,
            r"strategy= is a DDPStrategy instance you built\. Pass them to its constructor instead",
        ),
        (
            {"precision": DoublePrecision(), "precision_options": {"scaler_kwargs": {}}},
            ValueError,
            r"precision_options \(scaler_kwargs\) configure a precision built from a name, but the precision is the "
            r"DoublePrecision instance given by precision=",
        ),
    ],
)
def test_options_that_cannot_apply_are_clear_errors(
    kwargs: dict[str, Any], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        dt.connect(accelerator="cpu", devices=2, **kwargs)


def test_precision_options_reach_the_precision_built_from_a_name() -> None:
    strategy = dt.connect(
        accelerator="cpu",
        precision="16-mixed",
        precision_options={
            "scaler_kwargs": {"init_scale": 64.0},
            "autocast_kwargs": {"cache_enabled": False},
        },
    )
    precision = strategy.precision
    assert isinstance(precision, MixedPrecision) and precision.scaler is not None
    assert precision.scaler.get_scale() == 64.0 and precision.autocast_kwargs == {"cache_enabled": False}
    with pytest.warns(
        UserWarning, match=r"precision option scaler_kwargs=\{'init_scale': 64.0\} has no effect: "
    ):
        plain = dt.connect(accelerator="cpu", precision_options={"scaler_kwargs": {"init_scale": 64.0}})
    assert type(plain.precision) is Precision
