"""ddp_spawn / ddp_fork: real processes started with torch.multiprocessing."""

from __future__ import annotations

import os
import threading

import pytest
import torch
from torch import nn

import drivetrain as dt
from drivetrain.strategies.launchers import MultiprocessingLauncher, ProcessFailedError
from helpers.launch_targets import fail_on_rank_one, train_and_return_weights, train_given_model

pytestmark = pytest.mark.multiprocess


def _reference(steps: int) -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    model = nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    generator = torch.Generator().manual_seed(3)
    x, y = torch.randn(8, 3, generator=generator), torch.randn(8, 1, generator=generator)
    for _ in range(steps):
        ((model(x) - y) ** 2).mean().backward()
        optimizer.step()
        optimizer.zero_grad()
    return model.state_dict()


def test_ddp_spawn_returns_rank_zero_result_matching_single_process_training() -> None:
    strategy = dt.connect(accelerator="cpu", strategy="ddp_spawn", devices=2)
    assert isinstance(strategy.launcher, MultiprocessingLauncher)
    result = strategy.launcher.launch(train_and_return_weights, strategy, 3)
    assert (result["rank"], result["world"]) == (0, 2)
    for name, value in _reference(3).items():
        torch.testing.assert_close(result["weights"][name], value, rtol=1e-5, atol=1e-6)


def test_a_failing_spawned_rank_is_named_with_its_traceback() -> None:
    strategy = dt.connect(accelerator="cpu", strategy="ddp_spawn", devices=2)
    with pytest.raises(
        ProcessFailedError, match=r"(?s)rank 1 \(pid \d+\) failed:.*ValueError: rank one is unhappy"
    ):
        strategy.launcher.launch(fail_on_rank_one, strategy)


def test_spawn_refuses_what_cannot_be_pickled_before_starting_anything() -> None:
    strategy = dt.connect(accelerator="cpu", strategy="ddp_spawn", devices=2)
    lock = threading.Lock()
    with pytest.raises(TypeError, match=r"arguments to run in the new processes cannot be pickled.*ddp_fork"):
        strategy.launcher.launch(train_and_return_weights, strategy, lock)

    def local_function() -> None:
        pass

    with pytest.raises(TypeError, match=r"function to run in the new processes cannot be pickled"):
        strategy.launcher.launch(local_function)


def test_ddp_fork_runs_local_functions() -> None:
    strategy = dt.connect(accelerator="cpu", strategy="ddp_fork", devices=2)
    marker = {"value": 41}

    def run() -> int:
        strategy.setup_environment()
        total = strategy.all_reduce(torch.tensor([1.0]), reduce_op="sum").item()
        strategy.teardown()
        return int(total) + marker["value"] - 2 + strategy.world_size

    assert strategy.launcher.launch(run) == 43


def test_spawned_ranks_train_their_own_copy_of_a_model_passed_in() -> None:
    # torch's multiprocessing pickler would put the parameters in shared memory, so both ranks (and
    # the parent) would apply every update: the parent's model must stay untouched, and the trained
    # weights must equal single-process training, not a doubled update.
    torch.manual_seed(0)
    model = nn.Linear(3, 1)
    before = {name: value.clone() for name, value in model.state_dict().items()}
    strategy = dt.connect(accelerator="cpu", strategy="ddp_spawn", devices=2)
    result = strategy.launcher.launch(train_given_model, strategy, model, 3)
    for name, value in model.state_dict().items():
        assert torch.equal(value, before[name])
    for name, value in _reference(3).items():
        torch.testing.assert_close(result[name], value, rtol=1e-5, atol=1e-6)


def _open_sockets() -> int:
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            count += os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")
        except OSError:  # the listing's own descriptor, closed meanwhile
            pass
    return count


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts open sockets through /proc")
def test_a_failed_launch_closes_its_rendezvous_store_while_the_error_is_still_held() -> None:
    """The launching process hosts the ranks' store; kept serving as long as the error lives (a notebook
    keeps the last one), its thread and sockets are inherited by every later fork, which could then hang."""
    strategy = dt.connect(accelerator="cpu", strategy="ddp_fork", devices=2)
    before = _open_sockets()
    with pytest.raises(ProcessFailedError) as failure:
        strategy.launcher.launch(fail_on_rank_one, strategy)
    assert failure.value.rank == 1
    assert _open_sockets() == before
