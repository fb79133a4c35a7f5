"""A user's callback keeps one state per instance in checkpoints through the public generate_state_key."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from drivetrain.trainer import Callback, ModelCheckpoint
from trainer.trainer_models import Regression, loader, quiet_trainer


class BatchCounter(Callback):
    """Counts the training batches whose index is a multiple of ``every``; two instances may run at once."""

    def __init__(self, every: int) -> None:
        self.every = every
        self.count = 0

    @property
    def state_key(self) -> str:
        return self.generate_state_key(every=self.every)

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if batch_idx % self.every == 0:
            self.count += 1

    def state_dict(self) -> dict[str, Any]:
        return {"count": self.count}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.count = state_dict["count"]


class LightningStyleCounter(BatchCounter):
    """Written against Lightning, whose helper is private: the old name still works."""

    @property
    def state_key(self) -> str:
        return self._generate_state_key(every=self.every)


def test_each_instance_saves_and_restores_its_own_state(tmp_path: Path) -> None:
    first = [BatchCounter(every=1), BatchCounter(every=4), LightningStyleCounter(every=2)]
    saver = ModelCheckpoint(dirpath=tmp_path, filename="run")
    trainer = quiet_trainer(max_epochs=1, callbacks=[*first, saver], enable_checkpointing=True)
    trainer.fit(Regression(), loader())  # 8 batches
    assert [callback.count for callback in first] == [8, 2, 4]
    assert len({callback.state_key for callback in first}) == 3
    assert first[0].state_key == "BatchCounter{'every': 1}"

    restored = [BatchCounter(every=4), LightningStyleCounter(every=2), BatchCounter(every=1)]
    resumed = quiet_trainer(max_epochs=2, callbacks=restored)
    resumed.fit(Regression(), loader(), ckpt_path=tmp_path / "run.ckpt")
    assert [callback.count for callback in restored] == [4, 8, 16]  # restored, then one more epoch
