"""Accelerate behaviours drivetrain.Accelerator matches (issue 12): state views, pickling, per-process
checkpoint directories, batch samplers given as samplers, unwrapping, ``map_location``.

The 2-process checks share one launch (``_rank``); each test below reads its part of the results.
"""

from __future__ import annotations

import importlib.util
import os
import pickle
import tempfile
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import BatchSampler, DataLoader, Dataset, RandomSampler, TensorDataset

import drivetrain as dt
from drivetrain.facade import AcceleratorState, GradientState, PartialState
from drivetrain.utils import (
    DistributedOperationException,
    DistributedType,
    ProfileKwargs,
    broadcast,
    extract_model_from_parallel,
    find_executable_batch_size,
    gather,
    patch_environment,
    release_memory,
    synchronize_rng_states,
)
from helpers.multiprocess import run_processes

TORCHRUN = {"TORCHELASTIC_RUN_ID": "parity", "TORCHELASTIC_USE_AGENT_STORE": "True", "GROUP_RANK": "0"}


class Indexed(Dataset):  # type: ignore[type-arg]
    """Items 0..n-1; indexed by a list of indices (a batch sampler used as the sampler) it returns them all."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: Any) -> torch.Tensor:
        return torch.tensor(index)


def _states(out: dict[str, Any]) -> None:
    # Before any Accelerator exists: the state joins the launcher's processes by itself.
    state = PartialState(cpu=True)
    out["partial"] = (state.num_processes, state.process_index, state.distributed_type, str(state.device))
    out["free_gather"] = gather(torch.tensor([state.process_index])).tolist()  # the free functions find it
    with state.split_between_processes(["a", "b", "c"]) as share:
        out["split"] = share
    state.debug = True  # as Accelerate's test_ops: checked collectives from here on
    try:
        gather(torch.ones(1 + state.process_index))
    except DistributedOperationException as error:
        out["debug_error"] = str(error)
    try:
        broadcast({"t": torch.ones(1 + state.process_index)})
    except DistributedOperationException as error:
        out["debug_broadcast"] = str(error)
    state.debug = False

    accelerator = dt.Accelerator(cpu=True, mixed_precision="bf16")
    view = AcceleratorState()  # the latest Accelerator's
    out["accelerator_state"] = (view.mixed_precision, view.num_processes, accelerator.state.process_index)
    accelerator.state.distributed_type = (
        DistributedType.FSDP
    )  # a script may assign it (Accelerate's tests do)
    out["assigned"] = (accelerator.distributed_type, PartialState().distributed_type)


def _pickles(out: dict[str, Any], rank: int) -> None:
    accelerator = dt.Accelerator(cpu=True)
    model = nn.Linear(2, 1)
    model, _optimizer, loader = accelerator.prepare(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
        DataLoader(TensorDataset(torch.arange(8.0)), batch_size=2),
    )
    copy = pickle.loads(pickle.dumps(accelerator))
    out["pickled"] = (
        copy.state.__dict__ == accelerator.state.__dict__,
        copy.process_index,
        [batch[0].tolist() for batch in copy._objects.dataloaders[0]]
        == [batch[0].tolist() for batch in loader],
    )


def _batch_sampler_as_sampler(out: dict[str, Any], rank: int) -> None:
    torch.manual_seed(rank)  # different global seeds: the processes must still share one order
    accelerator = dt.Accelerator(cpu=True)
    data = Indexed(22)
    loader = DataLoader(
        data, sampler=BatchSampler(RandomSampler(data), batch_size=4, drop_last=False), batch_size=None
    )
    prepared = accelerator.prepare(loader)
    seen = [accelerator.gather_for_metrics(batch).tolist() for batch in prepared]
    out["batch_sampler"] = (len(prepared), sorted(i for batch in seen for i in batch))


def _per_process_directories(out: dict[str, Any], rank: int) -> None:
    accelerator = dt.Accelerator(cpu=True)
    model = nn.Linear(2, 1)
    model, _optimizer = accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    loader = accelerator.prepare(DataLoader(TensorDataset(torch.arange(40.0)), batch_size=2, shuffle=True))
    with tempfile.TemporaryDirectory() as directory:  # one per process, as in Accelerate's test
        expected, resumed = [], []
        for step, (batch,) in enumerate(loader):
            if step == 2:
                accelerator.save_state(directory)
                draws = torch.rand(3).tolist()
            if step > 2:
                expected.append(batch.tolist())
        out["files"] = sorted(path.name for path in Path(directory).iterdir())
        accelerator.load_state(directory, map_location="on_device")
        out["rng"] = torch.rand(3).tolist() == draws
        resumed = [batch.tolist() for (batch,) in loader]
        out["resumed"] = resumed == expected and len(expected) > 0


def _joins_and_rng(out: dict[str, Any], rank: int) -> None:
    accelerator = dt.Accelerator(cpu=True, even_batches=False)
    model = accelerator.prepare(nn.Linear(1, 1))
    loader = accelerator.prepare(DataLoader(TensorDataset(torch.arange(3.0).unsqueeze(1)), batch_size=1))
    steps = []
    with accelerator.join_uneven_inputs([model]):  # rank 0 has 2 batches, rank 1 one: no hang
        for step, (batch,) in enumerate(loader):
            model(batch).sum().backward()
            steps.append(step)
    even = dt.Accelerator(cpu=True)
    even_model = even.prepare(nn.Linear(1, 1))
    even_loader = even.prepare(DataLoader(TensorDataset(torch.arange(3.0)), batch_size=1))
    with even.join_uneven_inputs([even_model], even_batches=False):
        inside = (even_loader.batch_sampler.even_batches, len([b for b in even_loader]))
    out["join"] = (steps, inside, even_loader.batch_sampler.even_batches)

    synced = dt.Accelerator(cpu=True)
    twin = synced.prepare(nn.Linear(1, 1, bias=False))
    with synced.no_sync(twin):
        twin(torch.full((1, 1), float(rank + 1))).sum().backward()  # local: 1 and 2
        with synced.trigger_sync_in_backward(twin):
            twin(torch.full((1, 1), float(rank + 1))).sum().backward()  # all-reduced: (1+1 + 2+2) / 2
    out["triggered"] = twin.module.weight.grad.item()

    torch.manual_seed(rank)
    generator = torch.Generator().manual_seed(10 + rank)
    synchronize_rng_states(["torch", "generator"], generator=generator)
    out["rng_synced"] = (torch.rand(2).tolist(), torch.rand(2, generator=generator).tolist())


def _rank(rank: int, world_size: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    _states(out)  # first: its PartialState sets up the process group
    _joins_and_rng(out, rank)
    _pickles(out, rank)
    _batch_sampler_as_sampler(out, rank)
    _per_process_directories(out, rank)
    return out


@pytest.fixture(scope="module")
def results() -> list[dict[str, Any]]:
    return run_processes(_rank, 2, process_group=False, env=TORCHRUN, timeout=120)


@pytest.mark.multiprocess
def test_state_views_of_the_processes(results: list[dict[str, Any]]) -> None:
    for rank, out in enumerate(results):
        assert out["partial"] == (2, rank, DistributedType.MULTI_CPU, "cpu")
        assert out["free_gather"] == [0, 1]
        assert out["accelerator_state"] == ("bf16", 2, rank)
        assert out["assigned"] == (DistributedType.FSDP, DistributedType.MULTI_CPU)
        assert "rank 0: all_gather(shape (1,)" in out["debug_error"]
        assert "rank 1: all_gather(shape (2,)" in out["debug_error"]
        assert (
            "rank 0: {'t': 'shape (1,), torch.float32'}; rank 1: {'t': 'shape (2,)" in out["debug_broadcast"]
        )
    assert (results[0]["split"], results[1]["split"]) == (["a", "b"], ["c"])


@pytest.mark.multiprocess
def test_join_uneven_inputs_and_synchronized_generators(results: list[dict[str, Any]]) -> None:
    zero, one = results
    assert zero["join"] == ([0, 1], (False, 2), True) and one["join"] == ([0], (False, 1), True)
    assert zero["rng_synced"] == one["rng_synced"]
    assert zero["triggered"] == one["triggered"] == 3.0


@pytest.mark.multiprocess
def test_an_accelerator_pickles_with_its_prepared_objects(results: list[dict[str, Any]]) -> None:
    assert [out["pickled"] for out in results] == [(True, 0, True), (True, 1, True)]


@pytest.mark.multiprocess
def test_a_batch_sampler_given_as_the_sampler_is_shared_out(results: list[dict[str, Any]]) -> None:
    for out in results:
        assert out["batch_sampler"] == (3, list(range(22)))  # 6 batches dealt to 2 processes, each item once


@pytest.mark.multiprocess
def test_save_state_into_a_directory_per_process_resumes_every_process(results: list[dict[str, Any]]) -> None:
    zero, one = results
    assert zero["files"] == ["state.ckpt", "state.ckpt.process0"]
    assert one["files"] == ["state.ckpt.process1"]
    for out in results:
        assert out["rng"] and out["resumed"]


# torch.compile imports torch.fx, whose import uses the deprecated torch.jit.script_method.
@pytest.mark.filterwarnings(r"ignore:`torch\.jit\.script_method` is deprecated:DeprecationWarning")
def test_unwrap_model_strips_data_parallel_and_compile() -> None:
    accelerator = dt.Accelerator(cpu=True)
    model = nn.Linear(2, 1)
    parallel = nn.DataParallel(model)
    assert accelerator.unwrap_model(parallel) is model
    assert extract_model_from_parallel(parallel) is model
    compiled_parallel = torch.compile(parallel)
    assert accelerator.unwrap_model(compiled_parallel) is model
    assert extract_model_from_parallel(compiled_parallel, keep_torch_compile=False) is model
    compiled = torch.compile(model)
    assert accelerator.unwrap_model(nn.DataParallel(compiled)) is compiled  # keep_torch_compile=True
    assert accelerator.unwrap_model(compiled, keep_torch_compile=False) is model


def test_load_state_map_location(tmp_path: Path) -> None:
    accelerator = dt.Accelerator(cpu=True)
    model = accelerator.prepare(nn.Linear(2, 1))
    accelerator.save_state(tmp_path)
    with torch.no_grad():
        model.weight.zero_()
    accelerator.load_state(tmp_path, map_location="cpu")
    assert model.weight.abs().sum() > 0
    with pytest.raises(TypeError, match=r"load_state\(map_location='gpu'\) is not supported; use None"):
        accelerator.load_state(tmp_path, map_location="gpu")


def test_states_without_singletons() -> None:
    first, second = dt.Accelerator(cpu=True), dt.Accelerator(cpu=True, mixed_precision="bf16")
    first.state.distributed_type = DistributedType.DEEPSPEED
    assert (
        second.distributed_type == DistributedType.NO and first.distributed_type == DistributedType.DEEPSPEED
    )
    assert (first.state.mixed_precision, second.state.mixed_precision) == ("no", "bf16")
    AcceleratorState._reset_state()
    GradientState._reset_state()
    assert first.state.num_processes == 1 and first.gradient_state is not second.gradient_state
    with pytest.raises(TypeError, match=r"PartialState\(backend=...\) is not supported"):
        PartialState(backend="gloo")
    with pytest.raises(AttributeError, match="cannot be set"):
        first.state.num_processes = 3  # type: ignore[misc]


def test_accelerate_variables_are_defaults_the_arguments_override(
    monkeypatch: pytest.MonkeyPatch, hardware: Any
) -> None:
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "bf16")
    monkeypatch.setenv("ACCELERATE_GRADIENT_ACCUMULATION_STEPS", "4")
    monkeypatch.setenv("ACCELERATE_DEBUG_MODE", "1")
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "false")  # "off": nothing to warn about
    from_environment = dt.Accelerator()
    assert (from_environment.mixed_precision, from_environment.gradient_accumulation_steps) == ("bf16", 4)
    assert from_environment.debug
    explicit = dt.Accelerator(mixed_precision="no", gradient_accumulation_steps=2, debug=False)
    assert (explicit.mixed_precision, explicit.gradient_accumulation_steps, explicit.debug) == (
        "no",
        2,
        False,
    )

    hardware.cuda(1)  # a GPU is seen, but the job asks for the CPU
    monkeypatch.setenv("ACCELERATE_USE_CPU", "true")
    assert dt.Accelerator().device.type == "cpu"

    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    with pytest.warns(UserWarning, match=r"ACCELERATE_USE_FSDP='true': drivetrain.Accelerator does not read"):
        dt.Accelerator()
    monkeypatch.delenv("ACCELERATE_USE_FSDP")
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "fp4")
    with pytest.raises(ValueError, match="ACCELERATE_MIXED_PRECISION='fp4' is not supported"):
        dt.Accelerator()


def test_find_executable_batch_size_reduces_until_it_fits() -> None:
    tried: list[int] = []

    @find_executable_batch_size(starting_batch_size=64, reduce_batch_size_fn=lambda size: size // 2)
    def train(batch_size: int, scale: int) -> int:
        tried.append(batch_size)
        if batch_size > 16:
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return batch_size * scale

    assert train(10) == 160 and tried == [64, 32, 16]
    with pytest.raises(TypeError, match="Leave the batch size out of the call"):
        train(8, 10)

    @find_executable_batch_size(starting_batch_size=4)
    def never_fits(batch_size: int) -> None:
        raise torch.OutOfMemoryError("out of memory")

    with pytest.raises(RuntimeError, match="No executable batch size found"):
        never_fits()

    @find_executable_batch_size
    def other_error(batch_size: int) -> None:
        raise RuntimeError("shape mismatch")

    with pytest.raises(RuntimeError, match="shape mismatch"):
        other_error()
    assert release_memory(1, 2) == [None, None]


def test_profile_writes_a_chrome_trace_and_precision_facts(tmp_path: Path) -> None:
    accelerator = dt.Accelerator(cpu=True, kwargs_handlers=[ProfileKwargs(output_trace_dir=str(tmp_path))])
    model = accelerator.prepare(nn.Linear(4, 2))
    with accelerator.profile() as profiler:
        model(torch.ones(3, 4)).sum().backward()
    assert any("aten::addmm" in event.name for event in profiler.events())
    assert '"traceEvents"' in (tmp_path / "profile_0.json").read_text()
    with (
        pytest.raises(ValueError, match=r"activities=\[\.\.\., 'tpu'\]"),
        accelerator.profile(ProfileKwargs(activities=["tpu"])),
    ):
        pass
    assert (accelerator.scaler, accelerator.native_amp) == (None, False)
    fp16 = dt.Accelerator(cpu=True, mixed_precision="fp16")
    assert isinstance(fp16.scaler, torch.amp.GradScaler) and fp16.native_amp


def _report(directory: str) -> None:
    accelerator = dt.Accelerator()
    total = accelerator.reduce(torch.tensor([accelerator.process_index + 1.0])).item()
    line = f"{accelerator.process_index} {accelerator.num_processes} {accelerator.mixed_precision} {accelerator.device} {total}"
    (Path(directory) / f"rank{accelerator.process_index}").write_text(line)


def _fails(directory: str) -> None:
    raise RuntimeError(f"bad data in {directory}")


@pytest.mark.multiprocess
def test_notebook_and_debug_launchers_run_the_function_in_every_process(tmp_path: Path) -> None:
    dt.notebook_launcher(_report, (str(tmp_path),), num_processes=2, mixed_precision="bf16")
    assert sorted(path.read_text() for path in tmp_path.iterdir()) == ["0 2 bf16 cpu 3.0", "1 2 bf16 cpu 3.0"]
    for path in tmp_path.iterdir():
        path.unlink()
    dt.debug_launcher(_report, (str(tmp_path),))
    assert sorted(path.read_text() for path in tmp_path.iterdir()) == ["0 2 no cpu 3.0", "1 2 no cpu 3.0"]
    with pytest.raises(Exception, match="bad data in nowhere"):
        dt.debug_launcher(_fails, ("nowhere",))


def test_notebook_launcher_takes_accelerates_elastic_defaults(tmp_path: Path) -> None:
    # A migrated call may spell out Accelerate's defaults: they ask for nothing and are accepted.
    dt.notebook_launcher(_report, (str(tmp_path),), rdzv_backend="static", max_restarts=0, rdzv_id="none")
    assert [path.read_text() for path in tmp_path.iterdir()] == ["0 1 no cpu 1.0"]
    # max_restarts > 0 runs under torch's elastic agent (tests/facade/test_notebook_launcher.py).


def test_patch_environment_restores_the_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MASTER_PORT", "1234")
    monkeypatch.delenv("DRIVETRAIN_PARITY_X", raising=False)
    with patch_environment(master_port=29501, drivetrain_parity_x="y"):
        assert (os.environ["MASTER_PORT"], os.environ["DRIVETRAIN_PARITY_X"]) == ("29501", "y")
    assert os.environ["MASTER_PORT"] == "1234" and "DRIVETRAIN_PARITY_X" not in os.environ


def test_save_and_load_state_hooks_let_a_model_be_saved_its_own_way(tmp_path: Path) -> None:
    accelerator = dt.Accelerator(cpu=True)
    own, other = accelerator.prepare(nn.Linear(2, 2), nn.Linear(2, 1))
    calls: list[str] = []

    def save_hook(models: list[nn.Module], weights: list[dict[str, Any]], output_dir: str) -> None:
        torch.save(weights.pop(0), Path(output_dir) / "own.pt")  # saved its own way, not in the state
        calls.append(f"save {len(models)} models, {len(weights)} left")

    def load_hook(models: list[nn.Module], input_dir: str) -> None:
        models.pop(0).load_state_dict(torch.load(Path(input_dir) / "own.pt"))
        calls.append(f"load, {len(models)} left")

    save_handle = accelerator.register_save_state_pre_hook(save_hook)
    accelerator.register_load_state_pre_hook(load_hook)
    expected = [p.detach().clone() for p in (*own.parameters(), *other.parameters())]
    accelerator.save_state(tmp_path)
    with torch.no_grad():
        for parameter in (*own.parameters(), *other.parameters()):
            parameter.zero_()
    accelerator.load_state(tmp_path)
    assert all(torch.equal(a, b) for a, b in zip(expected, (*own.parameters(), *other.parameters())))
    assert calls == ["save 2 models, 1 left", "load, 1 left"]
    save_handle.remove()
    accelerator.save_state(tmp_path / "again")
    assert calls == ["save 2 models, 1 left", "load, 1 left"]
    with pytest.raises(TypeError, match="must be callable"):
        accelerator.register_load_state_pre_hook(3)  # type: ignore[arg-type]


def test_state_deepspeed_plugin_is_none_unless_the_run_uses_deepspeed() -> None:
    accelerator = dt.Accelerator(cpu=True)
    assert accelerator.state.deepspeed_plugin is None  # Accelerate's scripts then take their plain paths


@pytest.mark.deepspeed
@pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None, reason="needs the deepspeed extra")
def test_state_deepspeed_plugin_shows_the_deepspeed_strategys_settings() -> None:
    accelerator = dt.Accelerator(strategy="deepspeed_stage_2", cpu=True, devices=1)
    plugin = accelerator.state.deepspeed_plugin
    assert plugin is not None and plugin.zero_stage == 2
    assert plugin.deepspeed_config["zero_optimization"]["stage"] == 2
    accelerator.strategy.teardown()  # the one-process group goes with it
