"""The hooks a custom parallel strategy overrides are public, and overrides under their old private names still run."""

from __future__ import annotations

from typing import Any

import pytest
import torch.distributed as dist

import drivetrain as dt
from drivetrain.strategies import DDPStrategy, ParallelStrategy
from helpers.multiprocess import run_processes
from trainer.trainer_models import Regression, loader, quiet_trainer


class Ranked(DDPStrategy):
    """Sets the ranks itself (as a strategy whose scheduler the environment cannot read would)."""

    def __init__(self, calls: list[Any]) -> None:
        super().__init__()
        self.calls = calls

    def set_world_ranks(self) -> None:
        self.calls.append(("set_world_ranks", self.num_nodes, self.num_processes))
        super().set_world_ranks()


def test_connect_calls_the_set_world_ranks_override() -> None:
    calls: list[Any] = []
    strategy = dt.connect(accelerator="cpu", strategy=Ranked(calls), devices=2)
    assert calls == [("set_world_ranks", 1, 2)]
    assert (strategy.world_size, strategy.global_rank) == (2, 0)  # super() still tells the environment


def _define_old_style(calls: list[Any]) -> type[DDPStrategy]:
    class OldStyle(DDPStrategy):
        def _set_world_ranks(self) -> None:
            calls.append("_set_world_ranks")
            super()._set_world_ranks()

        def _release_communication_state(self) -> None:
            calls.append(("_release_communication_state", dist.is_initialized()))
            super()._release_communication_state()

    return OldStyle


def test_overrides_under_the_old_private_names_still_run_with_a_deprecation_warning() -> None:
    calls: list[Any] = []
    with pytest.warns(DeprecationWarning) as record:
        old_style = _define_old_style(calls)
    messages = sorted(str(warning.message) for warning in record)
    assert len(messages) == 2
    assert (
        "OldStyle._release_communication_state" in messages[0]
        and "release_communication_state" in messages[0]
    )
    assert "rename the method to set_world_ranks" in messages[1]
    assert {warning.filename for warning in record} == {__file__}  # points at the user's class

    strategy = dt.connect(accelerator="cpu", strategy=old_style(), devices=2)
    assert calls == ["_set_world_ranks"]
    assert strategy.world_size == 2


def test_a_hook_defined_under_both_names_is_an_error() -> None:
    with pytest.raises(
        TypeError, match=r"defines both _set_world_ranks and set_world_ranks.*Keep only set_world_ranks"
    ):

        class Both(ParallelStrategy):
            def set_world_ranks(self) -> None: ...

            def _set_world_ranks(self) -> None: ...


class Releasing(DDPStrategy):
    def __init__(self, calls: list[Any]) -> None:
        super().__init__()
        self.calls = calls

    def release_communication_state(self) -> None:
        self.calls.append(("release_communication_state", dist.is_initialized()))
        super().release_communication_state()


def _fit_and_leave(rank: int, world_size: int, strategy_class: type[Releasing]) -> list[Any]:
    calls: list[Any] = []
    trainer = quiet_trainer(strategy=strategy_class(calls), devices=2, max_epochs=1)
    trainer.fit(Regression(), loader())
    trainer.strategy.teardown()  # the script's end: the strategy leaves the process group
    return calls


@pytest.mark.multiprocess
def test_release_communication_state_runs_on_every_rank_while_the_group_is_alive() -> None:
    with pytest.warns(DeprecationWarning, match="OldStyle._release_communication_state"):

        class OldStyle(Releasing):  # a subclass written against the old name, chaining to the new one
            def _release_communication_state(self) -> None:
                self.calls.append(("_release_communication_state", dist.is_initialized()))
                super()._release_communication_state()

    # As under torchrun: each rank joins the store the parent hosts, and the strategy owns the group it creates.
    torchrun = {"TORCHELASTIC_RUN_ID": "hooks", "TORCHELASTIC_USE_AGENT_STORE": "True"}
    ranks = run_processes(_fit_and_leave, 2, args=(OldStyle,), process_group=False, env=torchrun, timeout=90)
    for calls in ranks:
        assert calls == [("_release_communication_state", True), ("release_communication_state", True)]
