"""One training loop written three ways: ``drivetrain.Trainer``, ``drivetrain.Accelerator`` and plain torch.

Used by the step-policy tests, which check that both front doors follow the core's policy
(accumulation windows that close at the data's end, clipping, skipped fp16 steps, per-step
schedulers) and end with the weights of the hand-written loop.

Each loop: a fixed-seed MLP, SGD with momentum, a per-step ``LambdaLR``, ``EPOCHS`` epochs of an
unshuffled loader, the loss of selected batches multiplied by ``blow_up`` (an overflow under
fp16: the scaler must skip that step).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import drivetrain as dt

EPOCHS = 2


@dataclass
class Loop:
    """What every version of the loop does."""

    samples: int = 56  # 7 batches of 8: the last accumulation window of an epoch is shorter
    batch_size: int = 8
    accumulate: int = 1
    clip: float | None = None
    precision: str = "32-true"
    blow_up: float = 1e35
    blown_batches: Collection[int] = field(
        default_factory=tuple
    )  # batch indices within an epoch, epoch 0 only

    def data(self) -> TensorDataset:
        generator = torch.Generator().manual_seed(5)
        x = torch.randn(self.samples, 4, generator=generator)
        return TensorDataset(
            x, x.sum(dim=1, keepdim=True) + 0.1 * torch.randn(self.samples, 1, generator=generator)
        )

    def loader(self, batch_size: int | None = None) -> DataLoader[Any]:
        return DataLoader(self.data(), batch_size=batch_size or self.batch_size, shuffle=False)

    def loss(self, output: torch.Tensor, y: torch.Tensor, epoch: int, batch_idx: int) -> torch.Tensor:
        loss = nn.functional.mse_loss(output, y)
        return loss * self.blow_up if epoch == 0 and batch_idx in self.blown_batches else loss


def net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))


def optimizer_and_schedule(model: nn.Module) -> tuple[torch.optim.Optimizer, Any]:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 0.9**step)


def weights(model: nn.Module) -> dict[str, torch.Tensor]:
    return {name: value.detach().clone() for name, value in model.state_dict().items()}


@dataclass
class Outcome:
    weights: dict[str, torch.Tensor]
    lr: float
    steps_taken: int  # optimizer steps the loss scaler did not skip
    grads: list[torch.Tensor]  # the first layer's weight gradient after each backward pass


# -- drivetrain.Trainer ---------------------------------------------------------------------------
class LoopModule(dt.TrainingModule):
    def __init__(self, loop: Loop) -> None:
        super().__init__()
        self.loop = loop
        self.net = net()
        self.taken = 0
        self.steps = 0
        self.grads: list[torch.Tensor] = []

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return self.loop.loss(self.net(x), y, self.current_epoch, batch_idx)

    def on_after_backward(self) -> None:
        self.grads.append(self.net[0].weight.grad.clone())

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        if (
            self.trainer.global_step != self.steps
        ):  # this batch ended a window: a step ran (or the scaler skipped it)
            self.steps = self.trainer.global_step
            self.taken += not self.trainer.strategy.precision.last_step_skipped

    def configure_optimizers(self) -> Any:
        optimizer, schedule = optimizer_and_schedule(self)
        return [optimizer], [{"scheduler": schedule, "interval": "step"}]


def run_trainer(loop: Loop, batch_size: int | None = None, **trainer_kwargs: Any) -> Outcome:
    """``batch_size``: per process (default ``loop.batch_size``); ``trainer_kwargs``: ``strategy``, ``devices`` …"""
    module = LoopModule(loop)
    trainer = dt.Trainer(
        accelerator="cpu",
        precision=loop.precision,
        max_epochs=EPOCHS,
        accumulate_grad_batches=loop.accumulate,
        gradient_clip_val=loop.clip,
        logger=False,
        enable_progress_bar=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        **trainer_kwargs,
    )
    trainer.fit(module, loop.loader(batch_size))
    lr = trainer.optimizers[0].param_groups[0]["lr"]
    return Outcome(weights(module.net), lr, module.taken, module.grads)


# -- drivetrain.Accelerator -------------------------------------------------------------------------
def run_accelerator(loop: Loop, split_batches: bool = False) -> Outcome:
    """``split_batches``: the loader's batches are global, each process takes its share of each."""
    mixed = {"32-true": "no", "16-mixed": "fp16", "bf16-mixed": "bf16"}[loop.precision]
    accelerator = dt.Accelerator(
        cpu=True,
        mixed_precision=mixed,
        gradient_accumulation_steps=loop.accumulate,
        split_batches=split_batches,
    )
    model = net()
    optimizer, schedule = optimizer_and_schedule(model)
    model, optimizer, loader, schedule = accelerator.prepare(model, optimizer, loop.loader(), schedule)
    taken = 0
    grads = []
    for epoch in range(EPOCHS):
        for batch_idx, (x, y) in enumerate(loader):
            with accelerator.accumulate(model):
                accelerator.backward(loop.loss(model(x), y, epoch, batch_idx))
                grads.append(accelerator.unwrap_model(model)[0].weight.grad.clone())
                if accelerator.sync_gradients and loop.clip is not None:
                    accelerator.clip_grad_norm_(model.parameters(), loop.clip)
                optimizer.step()
                schedule.step()
                if accelerator.sync_gradients:
                    taken += not accelerator.optimizer_step_was_skipped
                optimizer.zero_grad()
    return Outcome(weights(accelerator.unwrap_model(model)), schedule.get_last_lr()[0], taken, grads)


# -- plain torch ----------------------------------------------------------------------------------
def run_by_hand(loop: Loop) -> Outcome:
    """The loop as a PyTorch user writes it (one process)."""
    model = net()
    optimizer, schedule = optimizer_and_schedule(model)
    fp16 = loop.precision == "16-mixed"
    scaler = torch.amp.GradScaler("cpu") if fp16 else None
    batches = len(loop.loader())
    taken = 0
    grads = []
    for epoch in range(EPOCHS):
        for batch_idx, (x, y) in enumerate(loop.loader()):
            with torch.autocast("cpu", dtype=torch.float16, enabled=fp16):
                output = model(x)
            loss = loop.loss(output.float(), y, epoch, batch_idx) / loop.accumulate
            (scaler.scale(loss) if scaler is not None else loss).backward()
            grads.append(model[0].weight.grad.clone())
            if (batch_idx + 1) % loop.accumulate and batch_idx + 1 != batches:
                continue
            if scaler is not None:
                scaler.unscale_(optimizer)
            if loop.clip is not None:
                torch.nn.utils.clip_grad_norm_(model.parameters(), loop.clip)
            if scaler is not None:
                scale = scaler.get_scale()
                scaler.step(optimizer)
                scaler.update()
                skipped = scaler.get_scale() < scale
            else:
                optimizer.step()
                skipped = False
            if not skipped:
                schedule.step()
                taken += 1
            optimizer.zero_grad()
    return Outcome(weights(model), schedule.get_last_lr()[0], taken, grads)
