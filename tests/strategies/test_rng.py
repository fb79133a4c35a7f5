"""Random generators through checkpoints: every device type the same way, through the accelerator hooks.

A user's accelerator (a CPU stand-in for hardware with its own generator, registered by name) defines ``get_rng_state``/``set_rng_state``. Training draws from that device
generator every step, so a resumed run only ends where the uninterrupted one did if the device
generator came back from the checkpoint — in the Trainer and in ``Accelerator.save_state``, on
one and two processes. Resuming on another number of processes follows one policy in both doors.
"""

from __future__ import annotations

import io
import os
import random
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

import drivetrain as dt
from drivetrain.accelerators import Accelerator, AcceleratorRegistry, CPUAccelerator
from drivetrain.strategies import SingleDeviceStrategy
from drivetrain.strategies.rng import capture, restore, state_for_rank
from drivetrain.trainer import ModelCheckpoint
from helpers.multiprocess import run_processes
from trainer.trainer_models import Regression, quiet_trainer, regression_data, weights


class NoisyDevice:
    """The fictional device library: one generator per process, as ``torch.cuda`` keeps per GPU."""

    generator = torch.Generator().manual_seed(0)


class NoisyDeviceAccelerator(Accelerator):
    """A user's accelerator for ``NoisyDevice``; it computes on the CPU."""

    @staticmethod
    def parse_devices(devices: Any) -> Any:
        return devices

    @staticmethod
    def get_parallel_devices(devices: Any) -> list[torch.device]:
        return [torch.device("cpu")] * (devices if isinstance(devices, int) else len(devices))

    @staticmethod
    def auto_device_count() -> int:
        return 1

    @staticmethod
    def is_available() -> bool:
        return True

    def get_rng_state(self) -> Any:
        return {"generator": NoisyDevice.generator.get_state()}

    def set_rng_state(self, state: Any) -> None:
        NoisyDevice.generator.set_state(state["generator"])


def device_noise() -> torch.Tensor:
    """A factor drawn on the device, as a dropout mask would be."""
    return 1.0 + torch.rand((), generator=NoisyDevice.generator)


class NoisyRegression(Regression):
    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return super().training_step(batch, batch_idx) * device_noise()


@pytest.fixture(autouse=True)
def _registered() -> None:
    # Registered per test (the suite's fixture removes it afterwards), not at import.
    AcceleratorRegistry.register(
        "noisy", NoisyDeviceAccelerator, description="A device with its own random generator."
    )


def _device_state_after(rank: int) -> None:
    """A new process: its device generator starts wherever the device library says, not where the run was."""
    NoisyDevice.generator.manual_seed(1000 + rank)


# -- the Trainer ------------------------------------------------------------------------------
def _trainer_run(root: str, rank: int, devices: int, ckpt_path: str | None) -> dict[str, Any]:
    torch.manual_seed(0)
    _device_state_after(rank)
    model = NoisyRegression()
    checkpoint = ModelCheckpoint(
        dirpath=os.path.join(root, "full" if ckpt_path is None else "resumed"),
        every_n_train_steps=3,
        save_top_k=-1,
        filename="{step}",
    )
    strategy = "ddp" if devices > 1 else "auto"
    trainer = quiet_trainer(
        accelerator="noisy",
        devices=devices,
        strategy=strategy,
        max_epochs=2,
        callbacks=[checkpoint],
        enable_checkpointing=True,
    )
    data = DataLoader(regression_data(32), batch_size=4)  # 8 batches: 4 steps per epoch on 2 ranks
    trainer.fit(model, data, ckpt_path=ckpt_path)
    return {"weights": weights(model), "device": NoisyDevice.generator.get_state()}


def _trainer_full_and_resumed(rank: int, world: int, root: str) -> list[dict[str, Any]]:
    full = _trainer_run(root, rank, world, None)
    resumed = _trainer_run(root, rank, world, os.path.join(root, "full", "step=3.ckpt"))
    return [full, resumed]


def _assert_resumed_exactly(full: dict[str, Any], resumed: dict[str, Any]) -> None:
    for name, value in full["weights"].items():
        assert torch.equal(resumed["weights"][name], value), name
    assert torch.equal(resumed["device"], full["device"])


def test_a_user_accelerators_generator_survives_a_trainer_checkpoint(tmp_path: Path) -> None:
    full, resumed = _trainer_full_and_resumed(0, 1, str(tmp_path))
    _assert_resumed_exactly(full, resumed)


# -- the Accelerator --------------------------------------------------------------------------
def _accelerator_run(directory: str, rank: int, resume: bool) -> dict[str, Any]:
    accelerator = dt.Accelerator(accelerator="noisy")
    torch.manual_seed(0)
    _device_state_after(rank)
    model = nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    loader = DataLoader(regression_data(32), batch_size=4)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    if resume:
        accelerator.load_state(directory)
    for index, (x, y) in enumerate(loader):  # a resumed loader starts after the batch before the save
        loss = nn.functional.mse_loss(model(x), y) * device_noise()
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        if not resume and index == 0:
            accelerator.save_state(directory)
    return {"weights": weights(accelerator.unwrap_model(model)), "device": NoisyDevice.generator.get_state()}


def _accelerator_full_and_resumed(rank: int, world: int, directory: str) -> list[dict[str, Any]]:
    return [_accelerator_run(directory, rank, False), _accelerator_run(directory, rank, True)]


def test_a_user_accelerators_generator_survives_accelerator_save_state(tmp_path: Path) -> None:
    full, resumed = _accelerator_full_and_resumed(0, 1, str(tmp_path / "state"))
    _assert_resumed_exactly(full, resumed)


# -- two processes, each with its own device generator -------------------------------------------
def _both_doors(rank: int, world: int, root: str) -> dict[str, Any]:
    return {
        "trainer": _trainer_full_and_resumed(rank, world, os.path.join(root, "trainer")),
        "accelerator": _accelerator_full_and_resumed(rank, world, os.path.join(root, "accelerator")),
    }


@pytest.mark.multiprocess
def test_each_rank_gets_its_own_device_generator_back_in_both_doors(tmp_path: Path) -> None:
    ranks = run_processes(_both_doors, 2, args=(str(tmp_path),), timeout=120)
    for door in ("trainer", "accelerator"):
        (full0, resumed0), (full1, resumed1) = ranks[0][door], ranks[1][door]
        _assert_resumed_exactly(full0, resumed0)
        _assert_resumed_exactly(full1, resumed1)
        assert not torch.equal(full0["device"], full1["device"]), "the ranks' device generators are distinct"

    # Resumed by one process: one policy in both doors (warn, take rank r % N's generators).
    for door, resume in (
        (
            "trainer",
            lambda: _trainer_run(
                str(tmp_path / "trainer"), 0, 1, str(tmp_path / "trainer" / "full" / "step=3.ckpt")
            ),
        ),
        ("accelerator", lambda: _accelerator_run(str(tmp_path / "accelerator"), 0, True)),
    ):
        saved_device_state = _saved_rank0_device_state(tmp_path, door)
        with pytest.warns(
            UserWarning, match=r"saved by 2 process\(es\) and is resumed by 1\. Process r takes"
        ):
            restored = _state_right_after_restore(resume)
        assert torch.equal(restored, saved_device_state), door


def _saved_rank0_device_state(tmp_path: Path, door: str) -> torch.Tensor:
    if door == "trainer":
        checkpoint = torch.load(tmp_path / "trainer" / "full" / "step=3.ckpt", weights_only=True)
        return checkpoint["processes"][0]["rng"]["device"]["state"]["generator"]
    checkpoint = torch.load(tmp_path / "accelerator" / "state.ckpt", weights_only=True)
    return checkpoint["processes"][0]["rng"]["device"]["state"]["generator"]


def _state_right_after_restore(run: Any) -> torch.Tensor:
    """The device generator's state at the moment the checkpoint's generators were put back."""
    seen: list[torch.Tensor] = []
    original = NoisyDeviceAccelerator.set_rng_state

    def recording(self: NoisyDeviceAccelerator, state: Any) -> None:
        original(self, state)
        seen.append(NoisyDevice.generator.get_state())

    NoisyDeviceAccelerator.set_rng_state = recording  # type: ignore[method-assign]
    try:
        run()
    finally:
        NoisyDeviceAccelerator.set_rng_state = original  # type: ignore[method-assign]
    assert len(seen) == 1, "the checkpoint's device generators are restored once"
    return seen[0]


# -- the helper on its own -------------------------------------------------------------------------
def test_python_numpy_torch_and_device_generators_come_back() -> None:
    strategy = SingleDeviceStrategy(torch.device("cpu"), accelerator=NoisyDeviceAccelerator())
    states = capture(strategy)
    expected = (random.random(), float(np.random.rand()), torch.rand(2), device_noise())
    restore(strategy, states)
    again = (random.random(), float(np.random.rand()), torch.rand(2), device_noise())
    assert expected[:2] == again[:2]
    assert torch.equal(expected[2], again[2]) and torch.equal(expected[3], again[3])
    # Everything saved loads with weights_only=True.
    stream = io.BytesIO()
    torch.save(states, stream)
    stream.seek(0)
    torch.load(stream, weights_only=True)


def test_device_generators_from_other_hardware_are_left_alone_with_a_warning() -> None:
    saved = capture(SingleDeviceStrategy(torch.device("cpu"), accelerator=NoisyDeviceAccelerator()))
    cpu = SingleDeviceStrategy(torch.device("cpu"), accelerator=CPUAccelerator())
    before = NoisyDevice.generator.get_state()
    with pytest.warns(
        UserWarning,
        match=r"generators of NoisyDeviceAccelerator, which are not restored: "
        r"CPUAccelerator does not define set_rng_state",
    ):
        restore(cpu, {**saved, "device": {**saved["device"], "state": {"generator": torch.zeros(1)}}})
    assert torch.equal(NoisyDevice.generator.get_state(), before)
    saved["device"]["type"] = "cuda"
    with pytest.warns(UserWarning, match=r"'cuda' generators .* not restored: this run is on 'cpu'"):
        restore(SingleDeviceStrategy(torch.device("cpu"), accelerator=NoisyDeviceAccelerator()), saved)


def test_an_accelerator_with_get_but_no_set_says_what_to_define() -> None:
    class HalfDone(NoisyDeviceAccelerator):
        set_rng_state = Accelerator.set_rng_state

    with pytest.raises(NotImplementedError, match=r"HalfDone saved random-generator state .* Define both"):
        HalfDone().set_rng_state({"generator": torch.zeros(1)})
    assert CPUAccelerator().get_rng_state() is None
    CPUAccelerator().set_rng_state(None)  # nothing saved, nothing to do


def test_the_world_size_policy() -> None:
    saved = ["r0", "r1", "r2"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert [state_for_rank(saved, r, 3, source="ckpt") for r in range(3)] == saved
    with pytest.warns(UserWarning, match=r"'ckpt' was saved by 3 process\(es\) and is resumed by 2"):
        assert state_for_rank(saved, 0, 2, source="ckpt") == "r0"
    assert state_for_rank(saved, 1, 2, source="ckpt") == "r1"  # only rank 0 warns
    assert [state_for_rank(saved, r, 4, source="ckpt") for r in range(1, 4)] == ["r1", "r2", "r0"]
    with pytest.raises(ValueError, match="holds no per-process state"):
        state_for_rank([], 0, 1, source="ckpt")
