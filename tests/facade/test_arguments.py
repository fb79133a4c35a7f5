"""What the Accelerator's arguments resolve to, and the settings it refuses or warns about."""

from __future__ import annotations

import datetime
import warnings
from typing import Any

import pytest
import torch

import drivetrain as dt
from drivetrain.plugins.precision import MixedPrecision
from drivetrain.strategies import DDPStrategy, SingleDeviceStrategy, StrategyRegistry
from drivetrain.utils import (
    AutocastKwargs,
    DataLoaderConfiguration,
    DistributedDataParallelKwargs,
    GradientAccumulationPlugin,
    GradScalerKwargs,
    InitProcessGroupKwargs,
    ProjectConfiguration,
)


def test_defaults_give_one_cpu_process() -> None:
    accelerator = dt.Accelerator(cpu=True)
    assert isinstance(accelerator.strategy, SingleDeviceStrategy)
    assert (accelerator.device, accelerator.num_processes, accelerator.process_index) == (
        torch.device("cpu"),
        1,
        0,
    )
    assert accelerator.is_main_process and accelerator.is_local_main_process and accelerator.is_last_process
    assert accelerator.mixed_precision == "no" and accelerator.distributed_type.value == "NO"
    assert not accelerator.split_batches and accelerator.even_batches and accelerator.dispatch_batches is None


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"mixed_precision": "bf16"}, "bf16-mixed"),
        ({"mixed_precision": "fp16"}, "16-mixed"),
        ({"fp16": True}, "16-mixed"),
        ({"precision": "bf16-true"}, "bf16-true"),
        ({"mixed_precision": "bf16", "precision": "bf16-mixed"}, "bf16-mixed"),
    ],
)
def test_precision_spellings(kwargs: dict[str, object], name: str) -> None:
    accelerator = dt.Accelerator(cpu=True, **kwargs)
    assert accelerator.strategy.precision.name == name


def test_fp16_on_cpu_is_real_loss_scaled_mixed_precision() -> None:
    accelerator = dt.Accelerator(cpu=True, mixed_precision="fp16")
    precision = accelerator.strategy.precision
    assert isinstance(precision, MixedPrecision) and precision.scaler is not None
    assert accelerator.mixed_precision == "fp16"
    model = accelerator.prepare(torch.nn.Linear(4, 2))
    assert model(torch.randn(3, 4)).dtype == torch.float32, "outputs come back in float32"
    with accelerator.autocast():
        assert model.__class__.forward(model, torch.randn(3, 4)).dtype == torch.float16


def test_conflicting_and_unknown_settings_are_errors() -> None:
    with pytest.raises(ValueError, match="precision is set twice and the settings disagree"):
        dt.Accelerator(cpu=True, mixed_precision="fp16", precision="bf16-mixed")
    with pytest.raises(
        ValueError, match="mixed_precision='fp4' is not supported; use one of 'no', 'fp16', 'bf16', 'fp8'"
    ):
        dt.Accelerator(cpu=True, mixed_precision="fp4")
    with pytest.raises(ValueError, match="cpu=True asks for the CPU, but accelerator='cuda'"):
        dt.Accelerator(cpu=True, accelerator="cuda")
    with pytest.raises(
        ValueError, match=r"split_batches=True disagrees with dataloader_config\.split_batches=False"
    ):
        dt.Accelerator(cpu=True, split_batches=True, dataloader_config=DataLoaderConfiguration())
    with pytest.raises(
        ValueError, match="gradient_accumulation_steps or gradient_accumulation_plugin, not both"
    ):
        dt.Accelerator(
            cpu=True,
            gradient_accumulation_steps=2,
            gradient_accumulation_plugin=GradientAccumulationPlugin(2),
        )
    with pytest.raises(ValueError, match="gradient_accumulation_steps must be an int >= 1, got 0"):
        dt.Accelerator(cpu=True, gradient_accumulation_steps=0)
    with pytest.raises(ValueError, match="drivetrain uses strategy='fsdp'"):
        dt.Accelerator(cpu=True, fsdp_plugin=object())
    with pytest.raises(ValueError, match=r"project_dir='a' disagrees with project_config\.project_dir='b'"):
        dt.Accelerator(cpu=True, project_dir="a", project_config=ProjectConfiguration(project_dir="b"))
    with pytest.raises(ValueError, match=r"log_with='comet' names the logger 'comet', which is unknown"):
        dt.Accelerator(cpu=True, log_with="comet")
    with pytest.raises(ValueError, match=r"cannot synchronise: 'npu'"):
        dt.Accelerator(cpu=True, rng_types=["npu"])


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        # A truthy string would otherwise be taken as True: device_placement="no" placed everything.
        ({"device_placement": "no"}, r"device_placement expects True or False, got str \('no'\)"),
        ({"split_batches": "yes"}, r"split_batches expects True or False, got str \('yes'\)"),
        ({"even_batches": 0}, r"even_batches expects True or False, got int \(0\)"),
        ({"dispatch_batches": "auto"}, r"dispatch_batches expects True or False \(or None: for iterable"),
        ({"step_scheduler_with_optimizer": 1}, "step_scheduler_with_optimizer expects True or False"),
        (
            {"project_dir": 5},
            r"project_dir=5 \(int\) is not a path\. Pass a str or a pathlib\.Path, such as 'runs/exp1'",
        ),
    ],
)
def test_settings_of_the_wrong_type_are_named(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(TypeError, match=message):
        dt.Accelerator(cpu=True, **kwargs)


def test_a_path_argument_of_the_wrong_type_is_named(tmp_path: Any) -> None:
    accelerator = dt.Accelerator(cpu=True)
    with pytest.raises(TypeError, match=r"expected a path, got int \(5\)\. Pass a str or a pathlib\.Path"):
        accelerator.save_model(torch.nn.Linear(2, 2), 5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"data_seed expects an int or None, got str"):
        DataLoaderConfiguration(data_seed="1")  # type: ignore[arg-type]


def test_kwargs_handlers_are_checked() -> None:
    class FP8RecipeKwargs:
        pass

    with pytest.raises(TypeError, match=r"Unsupported kwargs handler .*FP8RecipeKwargs"):
        dt.Accelerator(cpu=True, kwargs_handlers=[FP8RecipeKwargs()])
    with pytest.raises(ValueError, match="two GradScalerKwargs"):
        dt.Accelerator(
            cpu=True, mixed_precision="fp16", kwargs_handlers=[GradScalerKwargs(), GradScalerKwargs()]
        )
    with pytest.raises(
        ValueError, match=r"InitProcessGroupKwargs\(init_method='tcp://x:1'\) is not supported"
    ):
        dt.Accelerator(cpu=True, kwargs_handlers=[InitProcessGroupKwargs(init_method="tcp://x:1")])
    with pytest.raises(ValueError, match=r"DistributedDataParallelKwargs\(comm_hook=...\) is not supported"):
        dt.Accelerator(cpu=True, kwargs_handlers=[DistributedDataParallelKwargs(comm_hook="fp16")])
    with pytest.warns(
        UserWarning, match=r"scaler_kwargs=\{'init_scale': 8.0\} has no effect: precision '32-true'"
    ):
        dt.Accelerator(cpu=True, kwargs_handlers=[GradScalerKwargs(init_scale=8.0)])
    with pytest.warns(
        UserWarning, match=r"scaler_kwargs=\{'init_scale': 8.0\} has no effect: precision 'bf16-mixed'"
    ):
        dt.Accelerator(cpu=True, mixed_precision="bf16", kwargs_handlers=[GradScalerKwargs(init_scale=8.0)])
    with pytest.warns(UserWarning, match="autocast_kwargs=.* has no effect: precision '32-true'"):
        dt.Accelerator(cpu=True, kwargs_handlers=[AutocastKwargs(cache_enabled=True)])
    with pytest.raises(
        ValueError,
        match=r"precision_options \(scaler_kwargs\) .* the MixedPrecision instance given by precision=",
    ):
        dt.Accelerator(
            precision=MixedPrecision("16-mixed", device="cpu"),
            kwargs_handlers=[GradScalerKwargs(init_scale=8.0)],
        )


def test_only_changed_handler_fields_are_passed_on() -> None:
    assert DistributedDataParallelKwargs().to_kwargs() == {}
    assert DistributedDataParallelKwargs(static_graph=True, bucket_cap_mb=25).to_kwargs() == {
        "static_graph": True
    }
    handler = InitProcessGroupKwargs(timeout=datetime.timedelta(seconds=5))
    assert handler.to_kwargs() == {"timeout": datetime.timedelta(seconds=5)}


def test_scaler_and_autocast_options_reach_the_precision() -> None:
    accelerator = dt.Accelerator(
        cpu=True,
        mixed_precision="fp16",
        kwargs_handlers=[
            GradScalerKwargs(init_scale=1024.0, growth_interval=7),
            AutocastKwargs(enabled=False),
        ],
    )
    precision = accelerator.strategy.precision
    assert precision.scaler.get_scale() == 1024.0 and precision.scaler.get_growth_interval() == 7
    model = accelerator.prepare(torch.nn.Linear(2, 2))
    with accelerator.autocast():
        assert torch.nn.Linear.forward(model, torch.randn(1, 2)).dtype == torch.float32  # autocast disabled


def test_ddp_options_need_a_strategy_the_accelerator_builds() -> None:
    with pytest.raises(
        ValueError, match=r"Pass them to its constructor instead, e.g. DDPStrategy\(static_graph=...\)"
    ):
        dt.Accelerator(
            cpu=True,
            devices=2,
            strategy=DDPStrategy(start_method="fork"),
            kwargs_handlers=[DistributedDataParallelKwargs(static_graph=True)],
        )


class CountedDDP(DDPStrategy):
    built = 0

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        CountedDDP.built += 1


def test_kwargs_handlers_configure_the_one_strategy_connect_builds() -> None:
    StrategyRegistry.register("counted_ddp_fork", CountedDDP, description="test", start_method="fork")
    CountedDDP.built = 0
    accelerator = dt.Accelerator(  # fork: the processes start at accelerator.launch(), not here
        cpu=True,
        devices=2,
        strategy="counted_ddp_fork",
        kwargs_handlers=[
            DistributedDataParallelKwargs(static_graph=True),
            InitProcessGroupKwargs(backend="gloo", timeout=datetime.timedelta(seconds=9)),
        ],
    )
    strategy = accelerator.strategy
    assert type(strategy) is CountedDDP and CountedDDP.built == 1
    assert strategy.ddp_kwargs == {"static_graph": True}
    assert (strategy.process_group_backend, strategy.timeout, strategy.start_method) == (
        "gloo",
        datetime.timedelta(seconds=9),
        "fork",
    )


def test_ddp_options_for_a_strategy_that_takes_none_are_an_error() -> None:
    with pytest.raises(
        TypeError,
        match=r"registered strategy 'fsdp' \(FSDPStrategy\) with strategy_options \['static_graph'\]",
    ):
        dt.Accelerator(
            cpu=True,
            devices=2,
            strategy="fsdp",
            kwargs_handlers=[DistributedDataParallelKwargs(static_graph=True)],
        )


def test_one_process_ignores_process_group_options_quietly() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        accelerator = dt.Accelerator(
            cpu=True, kwargs_handlers=[InitProcessGroupKwargs(timeout=datetime.timedelta(seconds=9))]
        )
    assert isinstance(accelerator.strategy, SingleDeviceStrategy)


def test_spawned_strategies_ask_for_launch() -> None:
    accelerator = dt.Accelerator(cpu=True, devices=2, strategy="ddp_spawn")
    with pytest.raises(RuntimeError, match=r"run it with accelerator.launch\(train_function"):
        accelerator.prepare(torch.nn.Linear(1, 1))


def test_two_accelerators_keep_separate_state() -> None:
    first = dt.Accelerator(cpu=True, gradient_accumulation_steps=2)
    second = dt.Accelerator(cpu=True)
    first_model = first.prepare(torch.nn.Linear(1, 1))
    second.prepare(torch.nn.Linear(1, 1))
    with first.accumulate(first_model):
        assert not first.sync_gradients and second.sync_gradients
    assert first.step == 1 and second.step == 0
    assert first.gradient_state is not second.gradient_state
    first.set_trigger()
    assert first.check_trigger() and not second.check_trigger()


def test_step_calls_with_the_wrong_objects_are_named(tmp_path: Any) -> None:
    accelerator = dt.Accelerator(cpu=True)
    net = torch.nn.Linear(4, 1)
    model, _ = accelerator.prepare(net, torch.optim.SGD(net.parameters(), lr=0.1))
    loss = model(torch.randn(2, 4)).sum()
    with pytest.raises(TypeError, match=r"backward\(\) expects the loss tensor, got float \(1\.5\)"):
        accelerator.backward(1.5)  # type: ignore[arg-type]
    accelerator.backward(loss)
    with pytest.raises(TypeError, match=r"clip_grad_norm_\(\) .* got Linear\. Pass model\.parameters\(\)\.$"):
        accelerator.clip_grad_norm_(model, 1.0)
    with pytest.raises(
        TypeError, match=r"clip_grad_value_\(\) .* got int\. Pass model\.parameters\(\) or a list"
    ):
        accelerator.clip_grad_value_(5, 1.0)  # type: ignore[arg-type]
    assert float(accelerator.clip_grad_norm_(model.parameters(), 1.0)) > 0
    (tmp_path / "state.txt").write_text("not a folder")
    with pytest.raises(
        FileExistsError, match=r"state\.txt'\): that is a file, and save_state writes a folder"
    ):
        accelerator.save_state(tmp_path / "state.txt")
