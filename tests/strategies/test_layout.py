"""The parallel layout and its checks, without processes: every mistake is a clear error."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator

import pytest
import torch.distributed as dist
from torch import nn

import drivetrain as dt
from drivetrain.strategies import ModelParallelStrategy, ParallelismConfig, ParallelLayout, StrategyRegistry
from drivetrain.utils import TorchContextParallelConfig, TorchTensorParallelConfig


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


@pytest.fixture
def fake_job() -> Iterator[Callable[[int], None]]:
    """A process group of N pretend ranks in this one process (torch's fake backend): meshes of any size, no peers."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    def start(world_size: int) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world_size)

    yield start
    if dist.is_initialized():
        dist.destroy_process_group()


# Accelerate's table (its test_dataclasses): sizes -> the mesh's shape and dimension names.
MESHES = [
    ((8, 1, 1, 1), (8,), ("dp_replicate",)),
    ((1, 8, 1, 1), (8,), ("dp_shard",)),
    ((2, 4, 1, 1), (2, 4), ("dp_replicate", "dp_shard")),
    ((1, 4, 2, 1), (4, 2), ("dp_shard", "tp")),
    ((2, 2, 2, 1), (2, 2, 2), ("dp_replicate", "dp_shard", "tp")),
    ((1, 1, 8, 1), (8,), ("tp",)),
    ((1, 1, 1, 4), (4,), ("cp",)),
    ((1, 4, 1, 2), (4, 2), ("dp_shard", "cp")),
    ((1, 2, 2, 2), (2, 2, 2), ("dp_shard", "cp", "tp")),
    ((2, 2, 2, 2), (2, 2, 2, 2), ("dp_replicate", "dp_shard", "cp", "tp")),
]


@pytest.mark.parametrize(("sizes", "shape", "names"), MESHES)
def test_parallelism_config_builds_accelerates_mesh(
    fake_job: Callable[[int], None],
    sizes: tuple[int, int, int, int],
    shape: tuple[int, ...],
    names: tuple[str, ...],
) -> None:
    replicate, shard, tp, cp = sizes
    config = ParallelismConfig(dp_replicate_size=replicate, dp_shard_size=shard, tp_size=tp, cp_size=cp)
    assert config._get_mesh() == (names, shape)
    fake_job(replicate * shard * tp * cp)
    device = "cuda" if cp > 1 else "cpu"  # context parallelism is CUDA's; the fake group does not care
    mesh = config.build_device_mesh(device)
    assert (mesh.shape, mesh.mesh_dim_names) == (shape, names)
    assert config.get_device_mesh() is mesh and config.device_mesh is mesh
    flattened = {name: config.flattened_meshes.get(name) for name in ("dp", "dp_shard_cp", "dp_cp")}
    expected = {
        "dp": config.dp_dim_names,
        "dp_shard_cp": config.dp_shard_cp_dim_names,
        "dp_cp": config.dp_cp_dim_names,
    }
    for name, dims in expected.items():
        assert (flattened[name] is not None) == bool(dims), name
        if dims:
            assert flattened[name].size() == math.prod(config._size(d) for d in dims), name


def test_parallelism_config_mesh_needs_the_right_job(fake_job: Callable[[int], None]) -> None:
    assert ParallelismConfig().build_device_mesh("cpu") is None  # every size 1: no mesh, as in Accelerate
    fake_job(4)
    with pytest.raises(RuntimeError, match=r"make 2 processes, but the process group has 4"):
        ParallelismConfig(dp_shard_size=2).build_device_mesh("cpu")
    assert ParallelismConfig(dp_shard_size=-1, tp_size=2).build_device_mesh("cpu").shape == (2, 2)
    with pytest.raises(ValueError, match="No device mesh is built yet"):
        ParallelismConfig(tp_size=4).get_device_mesh()


def test_parallelism_config_fields_and_handlers_are_accelerates() -> None:
    config = ParallelismConfig(dp_shard_size=2, tp_size=2, cp_size=2)
    assert (config.cp_backend, config.sp_backend, config.sp_enabled) == ("torch", "deepspeed", False)
    assert isinstance(config.tp_handler, TorchTensorParallelConfig)
    assert config.cp_handler == TorchContextParallelConfig("allgather")
    assert (config.dp_dim_names, config.non_dp_dim_names, config.fsdp_dim_names) == (
        ["dp_shard"],
        ["tp", "cp"],
        ["dp_shard_cp"],
    )
    assert (config.data_parallel_size, config.non_data_parallel_size) == (2, 4)
    with pytest.raises(ValueError, match="Invalid cp_comm_strategy: ring"):
        TorchContextParallelConfig(cp_comm_strategy="ring")
    with pytest.raises(ValueError, match="'alltoall'\\) is not supported"):
        TorchContextParallelConfig(cp_comm_strategy="alltoall")
    with pytest.raises(ValueError, match=r"sequence parallelism .* is not supported"):
        ParallelismConfig(sp_size=2)
    with pytest.raises(ValueError, match="cp_backend='ring'\\) is not supported"):
        ParallelismConfig(cp_backend="ring")
    with pytest.warns(UserWarning, match="asynchronous tensor parallelism is not supported"):
        TorchTensorParallelConfig(enable_async_tp=True)
