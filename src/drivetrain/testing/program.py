"""The programs the kit runs with a plugin in them, through both front doors (they run in their own processes).

Three programs share the work of one run, so that each process start does several things:

* ``first``: the Trainer fits (with validation, checkpoints every few steps), validates, tests,
  predicts and validates a saved checkpoint; the Accelerator trains (saving its state every few
  steps) and evaluates with ``gather_for_metrics``; on several processes the strategy's collectives
  are checked; then the Trainer fits again and is killed (``SIGKILL``) after a checkpoint.
* ``second``: the Trainer resumes that fit from the newest checkpoint; then the Accelerator trains
  again and is killed after a ``save_state``.
* ``third``: the Accelerator resumes from the newest state.

Each writes what it saw to ``results/`` (read by :mod:`drivetrain.testing.outcomes`). The first
fits are the uninterrupted runs the resumed ones must equal bit for bit. The CLI program
(``python train.py fit --trainer.accelerator=NAME``, written by :mod:`drivetrain.testing.runner`)
puts the plugin in place with :func:`cli_run` and trains :class:`KitModule` on :class:`KitData`.
"""

from __future__ import annotations

import os
import re
import signal
import sys
import time
from pathlib import Path
from typing import Any

import torch

from drivetrain.testing.kit_model import (
    EPOCHS,
    PREDICT,
    TEST,
    TRAIN,
    VAL,
    KitModule,
    Progress,
    loader,
    network,
    noisy_loss,
    set_device_draw,
)
from drivetrain.testing.settings import PLUGIN, ProgramSettings, load
from drivetrain.testing.stand_ins import STAND_INS, StandIn
from drivetrain.trainer.callbacks.callback import Callback
from drivetrain.trainer.datamodule import DataModule

_ACCELERATOR_HOOKS = ("setup_device", "teardown", "get_rng_state", "set_rng_state")


class KitRun:
    """The plugin under test, put in place in this process as the settings say."""

    def __init__(self, settings: ProgramSettings) -> None:
        self.settings = settings
        self.root = Path(settings.root)
        self.stand_in: StandIn | None = None
        if settings.stand_in:
            cls = STAND_INS.get(settings.stand_in) or load(settings.stand_in)
            self.stand_in = cls(max(settings.devices, 2)).install()
            set_device_draw(lambda device: self.stand_in.draw() if self.stand_in else None)
        elif not settings.fake_class:
            set_device_draw(lambda device: torch.rand(1, device=device))  # the device's own generator
        for module in settings.imports:
            __import__(module)
        if settings.fake_class:
            from drivetrain.accelerators import AcceleratorRegistry
            from drivetrain.testing.fake import install_fake

            AcceleratorRegistry.available()
            install_fake(load(settings.fake_class), forced_count=settings.forced_count)
        self.calls: list[str] = []

    # -- the components ----------------------------------------------------------------------
    def component(self, what: str) -> Any:
        value = getattr(self.settings, what)
        return self._built(value) if value == PLUGIN else value

    def plugins(self) -> list[Any]:
        return [self._built(value) if value == PLUGIN else value for value in self.settings.plugins]

    def _built(self, value: str) -> Any:
        assert self.settings.target is not None
        found = load(self.settings.target)
        return found() if isinstance(found, type) else found

    def front_door_arguments(self) -> dict[str, Any]:
        settings = self.settings
        arguments: dict[str, Any] = {
            "accelerator": self.component("accelerator"),
            "strategy": self.component("strategy"),
            "plugins": self.plugins() or None,
        }
        if settings.precision is not None:
            arguments["precision"] = self.component("precision")
        return arguments

    def devices(self) -> Any:
        return "auto" if self.settings.launched else self.settings.devices

    def record(self, accelerator: Any) -> None:
        """Note each call drivetrain makes to the hardware accelerator's hooks (on this instance)."""
        for name in _ACCELERATOR_HOOKS:
            original = getattr(accelerator, name)

            def hook(*args: Any, _original: Any = original, _name: str = name, **kwargs: Any) -> Any:
                self.calls.append(_name)
                return _original(*args, **kwargs)

            setattr(accelerator, name, hook)

    def seed(self) -> None:
        """What a training script does first; the stand-in's device generators start over as a device's would."""
        from drivetrain import seed_everything

        seed_everything(0)
        if self.stand_in is not None:
            self.stand_in.reseed()

    def device_generator(self) -> torch.Tensor | None:
        return self.stand_in.generator_state() if self.stand_in is not None else None

    # -- results -----------------------------------------------------------------------------
    def save(self, name: str, rank: int, data: dict[str, Any]) -> None:
        folder = self.root / "results"
        folder.mkdir(parents=True, exist_ok=True)
        temporary = folder / f".{name}-rank{rank}.pt.tmp"
        torch.save(data, temporary)
        temporary.replace(folder / f"{name}-rank{rank}.pt")

    def die(self, door: str, rank: int, checkpoint_io: Any) -> None:
        """End this process as a crash would, once the checkpoints asked for so far are complete.

        An asynchronous checkpoint IO may still be writing the last one: a real crash would lose it (and
        the run would resume from the one before); the kill waits for it (``teardown()`` finishes pending
        work), so that what is compared is the resume, not the race.
        """
        checkpoint_io.teardown()
        if rank == 0:
            (self.root / "results" / f"killed-{door}").write_text("killed after a checkpoint\n")
            sys.stdout.flush()
            sys.stderr.flush()
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(60)  # other ranks wait for the launcher to end them (they must not finish the run)


def newest(folder: Path) -> Path:
    """The checkpoint (file or folder) with the highest ``step=N`` in its name."""
    found = [(int(m.group(1)), p) for p in folder.iterdir() if (m := re.search(r"step=(\d+)", p.name))]
    if not found:
        raise FileNotFoundError(
            f"no checkpoint (a name with step=N) in {folder}: {sorted(os.listdir(folder))}"
        )
    return max(found)[1]


def _plain(tensor: torch.Tensor) -> torch.Tensor:
    """A plain CPU copy; a sharded tensor (DTensor) as this process's shard, compared rank by rank."""
    local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
    return local.detach().cpu().clone().as_subclass(torch.Tensor)


def _state(values: dict[str, Any]) -> dict[str, Any]:
    return {k: _plain(v) for k, v in values.items() if isinstance(v, torch.Tensor)}


def _optimizer_state(optimizer: Any) -> dict[str, Any]:
    """Every tensor of the optimizer's state dict by its path (torch's layout, or an engine's own, as DeepSpeed's)."""
    found: dict[str, torch.Tensor] = {}

    def walk(value: Any, path: str) -> None:
        if isinstance(value, torch.Tensor):
            found[path] = _plain(value)
        elif isinstance(value, dict):
            for key, item in value.items():
                walk(item, f"{path}.{key}" if path else str(key))
        elif isinstance(value, (list, tuple)):
            for index, item in enumerate(value):
                walk(item, f"{path}.{index}" if path else str(index))

    walk(optimizer.state_dict(), "")
    return found


# -- the Trainer door ----------------------------------------------------------------------------------
class KillAt(Callback):
    """Kills the run when a training batch starts at ``step`` (after the checkpoints before it)."""

    def __init__(self, run: KitRun, step: int) -> None:
        self.run, self.step = run, step

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        if trainer.global_step == self.step:
            self.run.die("trainer", trainer.global_rank, trainer.strategy.checkpoint_io)


def _trainer(run: KitRun, folder: str, kill: bool = False) -> Any:
    from drivetrain import Trainer
    from drivetrain.trainer.callbacks import ModelCheckpoint

    every = run.settings.kill_step // 2
    callbacks: list[Any] = [
        ModelCheckpoint(dirpath=run.root / folder, every_n_train_steps=every, save_top_k=-1)
    ]
    if kill:
        callbacks.append(KillAt(run, run.settings.kill_step))
    trainer = Trainer(
        **run.front_door_arguments(),
        devices=run.devices(),
        max_epochs=EPOCHS,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        callbacks=callbacks,
        default_root_dir=run.root,
    )
    run.record(trainer.accelerator)
    return trainer


def _fit_outcome(run: KitRun, trainer: Any, model: Any) -> dict[str, Any]:
    state = trainer.strategy.get_module_state_dict(trainer.model if trainer.model is not None else model)
    return {
        "steps": trainer.global_step,
        "weights": _state(state),
        "optimizer": _optimizer_state(trainer.optimizers[0]),
        "cpu_draw": torch.rand(3),
        "device_generator": run.device_generator(),
        "metrics": {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("val_")},
        "accelerator": type(trainer.accelerator).__name__,
        "strategy": type(trainer.strategy).__name__,
    }


def trainer_first(run: KitRun) -> None:
    run.seed()
    model = KitModule()
    trainer = _trainer(run, "trainer-uninterrupted")
    val, test = loader(VAL), loader(TEST)
    trainer.fit(model, loader(TRAIN, shuffle=True), val)
    outcome = _fit_outcome(run, trainer, model)
    checkpoint = run.root / "trainer-final.ckpt"
    trainer.save_checkpoint(checkpoint)  # right after fit, with the training state (as ZeRO-3 requires)
    outcome["validated"] = trainer.validate(model, val, verbose=False)[0]
    outcome["tested"] = trainer.test(model, test, verbose=False)[0]
    outcome["predictions"] = torch.cat(
        [p.detach().float().cpu() for p in trainer.predict(model, loader(PREDICT))]
    )
    try:
        outcome["from_checkpoint"] = trainer.validate(model, val, ckpt_path=checkpoint, verbose=False)[0]
    except NotImplementedError as refusal:  # the strategy says it does not do this: not applicable, with why
        outcome["from_checkpoint"] = {"not_implemented": str(refusal)}
    outcome["calls"] = list(run.calls)
    run.save("trainer-first", trainer.global_rank, outcome)


def trainer_killed(run: KitRun) -> None:
    run.seed()
    model = KitModule()
    trainer = _trainer(run, "trainer-killed", kill=True)
    trainer.fit(model, loader(TRAIN, shuffle=True), loader(VAL))
    run.save("trainer-not-killed", trainer.global_rank, {"steps": trainer.global_step})


def trainer_resumed(run: KitRun) -> None:
    run.seed()
    model = KitModule()
    run.calls.clear()
    trainer = _trainer(run, "trainer-killed")
    checkpoint = newest(run.root / "trainer-killed")
    trainer.fit(model, loader(TRAIN, shuffle=True), loader(VAL), ckpt_path=checkpoint)
    outcome = _fit_outcome(run, trainer, model)
    outcome["resumed_from"] = checkpoint.name
    outcome["calls"] = list(run.calls)
    run.save("trainer-resumed", trainer.global_rank, outcome)


# -- the Accelerator door --------------------------------------------------------------------------------
def _accelerator(run: KitRun) -> Any:
    from drivetrain import Accelerator

    devices = None if run.settings.launched else run.settings.devices
    accelerator = Accelerator(**run.front_door_arguments(), devices=devices)
    run.record(accelerator.strategy.accelerator)
    return accelerator


def _train(run: KitRun, accelerator: Any, folder: str, kill: bool = False, resume: bool = False) -> Any:
    run.seed()
    model = network()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    model, optimizer, train = accelerator.prepare(model, optimizer, loader(TRAIN, shuffle=True))
    progress = Progress()
    accelerator.register_for_checkpointing(progress)
    directory = run.root / folder
    if resume:
        accelerator.load_state(newest(directory))
    every = run.settings.kill_step // 2
    while progress.epoch < EPOCHS:
        for x, y in train:
            accelerator.backward(noisy_loss(model(x), y))
            optimizer.step()
            optimizer.zero_grad()
            progress.step += 1
            if progress.step % every == 0:
                accelerator.save_state(directory / f"step={progress.step}")
            if kill and progress.step == run.settings.kill_step:
                run.die("accelerator", accelerator.process_index, accelerator.strategy.checkpoint_io)
        progress.epoch += 1
    return model, optimizer, progress


def _accelerator_outcome(
    run: KitRun, accelerator: Any, model: Any, optimizer: Any, progress: Progress
) -> dict[str, Any]:
    return {
        "steps": progress.step,
        "weights": _state(accelerator.get_state_dict(model)),
        "optimizer": _optimizer_state(optimizer.optimizer if hasattr(optimizer, "optimizer") else optimizer),
        "cpu_draw": torch.rand(3),
        "device_generator": run.device_generator(),
        "accelerator": type(accelerator.strategy.accelerator).__name__,
        "strategy": type(accelerator.strategy).__name__,
        "world_size": accelerator.num_processes,
    }


def _declarations(accelerator: Any, model: Any, optimizer: Any) -> dict[str, Any]:
    """What the strategy declares, and what it did: a wrapper around the model, training after inference mode."""
    strategy = accelerator.strategy
    found: dict[str, Any] = {
        "wraps_models": bool(strategy.wraps_models),
        "wrapped": accelerator.unwrap_model(model) is not model,
        "supports_inference_mode": bool(strategy.supports_inference_mode),
        "after_inference_mode": "",
    }
    if strategy.supports_inference_mode:
        x, y = TRAIN.tensors[0][:4], TRAIN.tensors[1][:4]
        try:
            with torch.inference_mode():
                model(x.to(accelerator.device))
            accelerator.backward(noisy_loss(model(x.to(accelerator.device)), y.to(accelerator.device)))
            optimizer.zero_grad()
        except Exception as error:
            found["after_inference_mode"] = f"{type(error).__name__}: {error}"
    return found


def _evaluate(accelerator: Any, model: Any) -> dict[str, torch.Tensor]:
    model.eval()
    gathered = {}
    with torch.no_grad():
        for name, data in (("val", VAL), ("test", TEST), ("predict", PREDICT)):
            outputs = [
                accelerator.gather_for_metrics(model(x)).float().cpu()
                for x, _ in accelerator.prepare(loader(data))
            ]
            gathered[name] = torch.cat(outputs)
    model.train()
    return gathered


def accelerator_first(run: KitRun) -> None:
    accelerator = _accelerator(run)
    outcome: dict[str, Any] = {}
    if run.settings.collectives:
        from drivetrain.testing.collectives import check_collectives

        # Saved at once: a strategy whose collectives misbehave may break what follows.
        run.save("collectives", accelerator.process_index, check_collectives(accelerator.strategy, run.root))
    model, optimizer, progress = _train(run, accelerator, "accelerator-uninterrupted")
    outcome.update(_accelerator_outcome(run, accelerator, model, optimizer, progress))
    outcome["evaluated"] = _evaluate(accelerator, model)
    outcome["declarations"] = _declarations(accelerator, model, optimizer)
    outcome["calls"] = list(run.calls)

    run.save("accelerator-first", accelerator.process_index, outcome)
    accelerator.end_training()


def accelerator_killed(run: KitRun) -> None:
    accelerator = _accelerator(run)
    _train(run, accelerator, "accelerator-killed", kill=True)
    run.save("accelerator-not-killed", accelerator.process_index, {})


def accelerator_resumed(run: KitRun) -> None:
    accelerator = _accelerator(run)
    run.calls.clear()
    model, optimizer, progress = _train(run, accelerator, "accelerator-killed", resume=True)
    outcome = _accelerator_outcome(run, accelerator, model, optimizer, progress)
    outcome["calls"] = list(run.calls)
    run.save("accelerator-resumed", accelerator.process_index, outcome)
    accelerator.end_training()


PHASES = {
    "first": (accelerator_first, trainer_first, trainer_killed),
    "second": (trainer_resumed, accelerator_killed),
    "third": (accelerator_resumed,),
}


def main(argv: list[str] | None = None) -> None:
    """Run one phase: ``python program.py first|second|third`` (the kit writes and starts the script)."""
    phase = (argv if argv is not None else sys.argv[1:])[0]
    run = KitRun(ProgramSettings.from_environment())
    for part in PHASES[phase]:
        part(run)


# -- the CLI program ----------------------------------------------------------------------------------------
class KitData(DataModule):
    """The CLI program's data: the training and validation sets."""

    def train_dataloader(self) -> Any:
        return loader(TRAIN, shuffle=True)

    def val_dataloader(self) -> Any:
        return loader(VAL)


def cli_run() -> KitRun:
    """The plugin put in place for the CLI program (``train.py`` builds ``CLI(KitModule, KitData)`` after it)."""
    return KitRun(ProgramSettings.from_environment())


def cli_report(run: KitRun, trainer: Any) -> None:
    """What the CLI's trainer ran, for the kit."""
    run.save(
        "cli",
        trainer.global_rank,
        {
            "steps": trainer.global_step,
            "accelerator": type(trainer.accelerator).__name__,
            "strategy": type(trainer.strategy).__name__,
            "precision": str(trainer.precision),
            "world_size": trainer.world_size,
        },
    )
