"""The parallel layout and its checks, without processes: every mistake is a clear error."""

from __future__ import annotations

import pytest
from torch import nn

import drivetrain as dt
from drivetrain.strategies import ModelParallelStrategy, ParallelismConfig, ParallelLayout, StrategyRegistry


def test_one_size_is_inferred_from_the_world_size() -> None:
    assert ParallelLayout(tp=2).resolve(8) == ParallelLayout(dp_replicate=1, dp_shard=4, tp=2, cp=1)
    assert ParallelLayout(dp_replicate=2, dp_shard=2, tp="auto").resolve(16).tp == 4
    assert ParallelLayout(dp_shard=2, dp_replicate=-1).resolve(6).dp_replicate == 3
    resolved = ParallelLayout(dp_replicate=2, dp_shard=2, tp=2).resolve(8)
    assert (resolved.world_size, resolved.data_parallel_size) == (8, 4)


def test_ranks_of_a_tensor_parallel_group_share_a_data_parallel_rank() -> None:
    layout = ParallelLayout(dp_replicate=2, dp_shard=2, tp=2).resolve(8)
    assert [layout.data_parallel_rank(r) for r in range(8)] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert layout.coordinates(5) == {
        "dp_replicate": 1,
        "dp_shard": 0,
        "context_parallel": 0,
        "tensor_parallel": 1,
    }
    with pytest.raises(ValueError, match="outside this layout's 8 ranks"):
        layout.coordinates(8)


@pytest.mark.parametrize(
    ("layout", "world_size", "message"),
    [
        (ParallelLayout(dp_shard=3, tp=2), 4, r"dp_shard=3 x tp=2 x cp=1 = 6 processes, but the job has 4"),
        (ParallelLayout(dp_shard=1, tp=2), 4, r"here dp_shard=2"),
        (
            ParallelLayout(tp=3),
            4,
            r"cannot fill dp_shard='auto' for 4 processes: the other sizes \(tp=3 = 3\)",
        ),
    ],
)
def test_sizes_that_do_not_multiply_to_the_world_size_name_the_fix(
    layout: ParallelLayout, world_size: int, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        layout.resolve(world_size)


def test_bad_sizes_are_refused_at_construction() -> None:
    with pytest.raises(ValueError, match="dp_shard and tp are both 'auto'"):
        ParallelLayout(tp="auto")
    with pytest.raises(ValueError, match=r"tp=0 is not a group size"):
        ParallelLayout(tp=0)
    with pytest.raises(TypeError, match=r"cp= expects a positive int, 'auto' or -1, got float"):
        ParallelLayout(cp=2.0)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="tp= expects"):
        ParallelLayout(tp=True)


def test_context_parallel_off_cuda_names_the_requirement() -> None:
    with pytest.raises(ValueError, match=r"cp=2 .* needs CUDA GPUs: .* scaled-dot-product-attention"):
        ParallelLayout(cp=2).resolve(4).check_device("cpu")
    ParallelLayout(cp=2).resolve(4).check_device("cuda")  # allowed there


def test_submesh_names_are_checked_before_the_mesh_is_needed() -> None:
    layout = ParallelLayout(tp=2).resolve(4)
    with pytest.raises(ValueError, match="no sub-mesh 'model'; use one of 'dp_replicate'"):
        layout.submesh("model")
    with pytest.raises(RuntimeError, match="not built yet"):
        layout.submesh("tp")


def test_parallelism_config_takes_accelerates_fields() -> None:
    config = dt.ParallelismConfig(dp_shard_size=2, tp_size=2)
    assert (config.total_size, config.tp_enabled, config.fsdp_enabled, config.cp_enabled) == (
        4,
        True,
        True,
        False,
    )
    assert config.to_layout().resolve(4) == ParallelLayout(dp_shard=2, tp=2)
    assert ParallelismConfig(tp_size=2).to_layout().dp_shard == 1  # unset sizes are 1, as in Accelerate
    with pytest.raises(ValueError, match="ParallelismConfig: tp_size=0 is not a group size"):
        ParallelismConfig(tp_size=0)


def test_the_strategy_is_registered_and_checks_its_arguments() -> None:
    assert "model_parallel" in StrategyRegistry.available_strategies()
    with pytest.raises(ValueError, match="Give only the layout"):
        ModelParallelStrategy(2, layout=ParallelLayout(tp=2))
    with pytest.raises(TypeError, match="layout= expects a drivetrain ParallelLayout"):
        ModelParallelStrategy(layout=ParallelismConfig(tp_size=2))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="'diagonal' is not a style name"):
        ModelParallelStrategy(tp_plan={"net.0": "diagonal"})
    with pytest.raises(TypeError, match=r"tp_plan\['net.0'\] is Linear"):
        ModelParallelStrategy(tp_plan={"net.0": nn.Linear(1, 1)})


def test_connect_resolves_the_layout_against_the_devices() -> None:
    strategy = dt.connect(
        accelerator="cpu", strategy=ModelParallelStrategy(tensor_parallel_size=2), devices=4
    )
    assert isinstance(strategy, ModelParallelStrategy)
    assert strategy.layout == ParallelLayout(dp_shard=2, tp=2)
    assert strategy.distributed_sampler_kwargs == {"num_replicas": 2, "rank": 0}
    # Lightning's "auto" for both sizes: tensor parallel within a node, data parallel across nodes.
    lightning_auto = dt.connect(accelerator="cpu", strategy="model_parallel", devices=2)
    assert lightning_auto.layout == ParallelLayout(dp_shard=1, tp=2)  # type: ignore[attr-defined]


def test_connect_refuses_a_layout_that_does_not_fit() -> None:
    with pytest.raises(ValueError, match=r"tp=3 = 3\) do not divide 4"):
        dt.connect(accelerator="cpu", strategy=ModelParallelStrategy(tensor_parallel_size=3), devices=4)
    with pytest.raises(ValueError, match=r"cp=2 .* needs CUDA GPUs"):
        dt.connect(accelerator="cpu", strategy=ModelParallelStrategy(layout=ParallelLayout(cp=2)), devices=4)


def test_the_accelerator_refuses_parallelism_settings_that_cannot_work() -> None:
    config = ParallelismConfig(dp_shard_size=2, tp_size=2)
    with pytest.raises(ValueError, match="tp_plan= splits layers over the tensor-parallel ranks"):
        dt.Accelerator(cpu=True, tp_plan={"net.0": "colwise"})
    with pytest.raises(ValueError, match="strategy='ddp' asks for another"):
        dt.Accelerator(
            cpu=True, devices=4, strategy="ddp", parallelism_config=config, tp_plan={"a": "colwise"}
        )
    with pytest.raises(ValueError, match=r"ParallelismConfig\(tp_size=2\) needs a tensor-parallel plan"):
        dt.Accelerator(cpu=True, devices=4, parallelism_config=config)
    with pytest.raises(TypeError, match=r"parallelism_config= expects a drivetrain\.ParallelismConfig"):
        dt.Accelerator(cpu=True, parallelism_config={"tp_size": 2})
    with pytest.raises(ValueError, match=r"= 4 processes, but the job has 1"):
        dt.Accelerator(cpu=True, parallelism_config=config, tp_plan={"net.0": "colwise"})
