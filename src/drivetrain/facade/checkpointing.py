"""The Accelerator's door to the core checkpoint: ``save_state``, ``load_state``, ``register_for_checkpointing``.

The core (:mod:`drivetrain.strategies.checkpointing`) writes and reads the entries both doors
share: the prepared models, optimizers and schedulers, the precision plugin (loss scaler) and,
per process, the random generators and every prepared loader's position. The Accelerator adds
``"custom_<i>"`` (objects given to ``register_for_checkpointing``),
``"accumulation_step"`` and ``"iteration"``, and names the checkpoints: ``<dir>/state.ckpt``
(a file, or a folder under sharded strategies), with automatic naming
``<project_dir>/checkpoints/checkpoint_<i>``. After ``load_state`` each prepared loader continues
with the batch after the last one handed out.

Crash safety: the state is published only once complete; automatic checkpoints beyond
``total_limit`` are pruned only after the new one is, and ``load_state()`` picks the newest
complete one.
"""

from __future__ import annotations

import gc
import os
import re
import warnings
from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from torch import nn
from torch.optim import Optimizer

from drivetrain._utilities import paths

# The checkpoint writer and reader are imported when the Accelerator saves or loads.
if TYPE_CHECKING:
    from drivetrain.facade.prepared import PreparedObjects
    from drivetrain.facade.state import GradientState
    from drivetrain.strategies.checkpointing import TrainingObjects
    from drivetrain.strategies.strategy import Strategy
    from drivetrain.utils.configuration import ProjectConfiguration

STATE_FILE = "state.ckpt"
_CHECKPOINT_DIR = re.compile(r"^checkpoint_(\d+)$")
_CUSTOM = re.compile(r"^custom_(\d+)$")
_OPT_OUT = "Accelerator.load_state(..., load_kwargs={'weights_only': False})"


class StateCheckpoints:
    """``save_state``, ``load_state``, ``register_for_checkpointing`` and the state hooks of one Accelerator.

    Args:
        strategy: writes and reads the state.
        objects: the Accelerator's prepared and registered objects.
        project_configuration: automatic naming and ``total_limit``.
        gradient_state: its accumulation step is saved and restored.
        require_processes: raises when the run's processes are yet to be started (``ddp_spawn``).
    """

    def __init__(
        self,
        strategy: Strategy,
        objects: PreparedObjects,
        project_configuration: ProjectConfiguration,
        gradient_state: GradientState,
        require_processes: Callable[[str], None],
    ) -> None:
        self.strategy = strategy
        self.objects = objects
        self.project_configuration = project_configuration
        self.gradient_state = gradient_state
        self.require_processes = require_processes
        # OrderedDicts: torch's RemovableHandle holds a weak reference to them.
        self._save_state_hooks: OrderedDict[int, Callable[..., None]] = OrderedDict()
        self._load_state_hooks: OrderedDict[int, Callable[..., None]] = OrderedDict()
        #: The prepared objects (ids) last found to leave no unprepared optimizer behind.
        self._optimizers_checked_for: tuple[int, ...] | None = None

    def register_for_checkpointing(self, *objects: Any) -> None:
        """See :meth:`drivetrain.Accelerator.register_for_checkpointing`."""
        invalid = [
            f"\n\t- Item at index {index}, `{_pretty_name(obj)}`"
            for index, obj in enumerate(objects)
            if not (
                callable(getattr(obj, "state_dict", None)) and callable(getattr(obj, "load_state_dict", None))
            )
        ]
        if invalid:
            # The items listed as Accelerate lists them ("Item at index N, `Name`"), which programs look for.
            raise ValueError(
                "register_for_checkpointing saves objects through their `state_dict` and `load_state_dict` "
                f"functions, which these inputs lack:{''.join(invalid)}\nRegister objects that have both (wrap a "
                "tensor or a value in a small class with the two methods)."
            )
        self.objects.custom_objects.extend(objects)

    def save_state(
        self, output_dir: str | os.PathLike[str] | None = None, safe_serialization: bool = True, **kwargs: Any
    ) -> str:
        """See :meth:`drivetrain.Accelerator.save_state`."""
        from drivetrain.strategies.checkpointing import checkpoint_entries, write_checkpoint

        _no_model_kwargs("save_state", kwargs)
        self.require_processes("save_state")
        self._refuse_unprepared_optimizers()
        config = self.project_configuration
        automatic = output_dir is None
        directory = self._next_automatic_dir() if automatic else paths.normalize(output_dir, "output_dir")  # type: ignore[arg-type]
        paths.check(directory)
        if not automatic and paths.isfile(directory):
            raise FileExistsError(
                f"save_state(output_dir='{directory}'): that is a file, and save_state writes a folder. Pass a "
                f"folder's path (it is created if needed)."
            )
        strategy = self.strategy
        objects = self._training_objects()
        if self._save_state_hooks:
            objects.models = self._run_save_hooks(str(directory))
        entries = checkpoint_entries(strategy, objects, door="accelerator")
        entries.update({f"custom_{index}": obj for index, obj in enumerate(self.objects.custom_objects)})
        entries["accumulation_step"] = self.gradient_state.step
        entries["iteration"] = config.iteration
        try:
            write_checkpoint(strategy, paths.join(directory, STATE_FILE), entries)
        except FileNotFoundError as error:
            if paths.isdir(directory):
                raise
            raise FileNotFoundError(
                f"save_state: the folder '{directory}' was removed while this process was writing its state into "
                f"it, so nothing was saved. Another process saving into the same folder (automatic checkpoint "
                f"naming prunes beyond total_limit) or a clean-up removed it. Give each run its own "
                f"project_dir (or output_dir)."
            ) from error
        if automatic:
            if self.strategy.is_global_zero:
                _prune_automatic(paths.parent(directory), keep=config.total_limit, newest=directory)
            config.iteration += 1
        return directory

    def load_state(
        self,
        input_dir: str | os.PathLike[str] | None = None,
        load_kwargs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> str:
        """See :meth:`drivetrain.Accelerator.load_state`."""
        from drivetrain.plugins.io.atomic import resolve
        from drivetrain.strategies.checkpointing import (
            rank_paths,
            read_checkpoint,
            restore_process_state,
            restore_window_gradients,
        )

        map_location = self._map_location(kwargs.pop("map_location", None))
        _no_model_kwargs("load_state", kwargs)
        weights_only = _weights_only(load_kwargs)
        self.require_processes("load_state")
        config = self.project_configuration
        directory = self._latest_automatic_dir() if input_dir is None else paths.normalize(input_dir)
        located = rank_paths(self.strategy, paths.join(directory, STATE_FILE))
        if not located.per_process and self._main_process_finds_nothing(located.shared):
            directory = self._instead_of_interrupted(directory)
            located = rank_paths(self.strategy, paths.join(directory, STATE_FILE))
        if resolve(located.shared) is None:
            where = f"'{paths.parent(located.shared)}'" + (
                " (the main process's directory)" if located.per_process else ""
            )
            if _interrupted(directory):
                raise FileNotFoundError(
                    f"No complete training state in {where}: a save_state into it was interrupted (the process "
                    f"was killed while saving), and no folder beside it holds a complete state. Load an earlier "
                    f"state, or start afresh."
                )
            raise FileNotFoundError(
                f"No drivetrain training state in {where} (expected '{STATE_FILE}' inside, written by "
                f"Accelerator.save_state). Pass the directory save_state wrote."
            )
        objects = self._training_objects()
        if self._load_state_hooks:
            objects.models = self._run_load_hooks(str(directory))
        door = {f"custom_{index}": obj for index, obj in enumerate(self.objects.custom_objects)}
        door.update({"accumulation_step": 0, "iteration": 0})
        loaded = read_checkpoint(
            self.strategy,
            located,
            objects,
            door,
            weights_only=weights_only,
            opt_out=_OPT_OUT,
            map_location=map_location,
        )
        _check_registered_objects(directory, loaded.rest, len(self.objects.custom_objects))
        assert loaded.process is not None  # a full (not models-only) read
        restore_process_state(self.strategy, loaded.process, self.objects.dataloaders, source=str(directory))
        restore_window_gradients(loaded.process, objects.models)
        self.gradient_state.step = int(loaded.entries["accumulation_step"])
        if config.automatic_checkpoint_naming:
            config.iteration = int(loaded.entries["iteration"]) + 1
        return str(directory)

    def _main_process_finds_nothing(self, path: str) -> bool:
        """Whether nothing is published at ``path``, as the main process sees it (every process gets its answer)."""
        from drivetrain.plugins.io.atomic import resolve

        missing = resolve(path) is None if self.strategy.is_global_zero else None
        if self.strategy.world_size > 1:
            missing = self.strategy.broadcast(missing)
        return bool(missing)

    def _instead_of_interrupted(self, directory: str) -> str:
        """For a folder a killed ``save_state`` left without its state: the newest complete state beside it.

        ``save_state(dir)`` creates ``dir`` before its state is complete, so a kill leaves a folder
        that a "load the newest folder" resume picks. Such a folder (empty, or holding only the
        temporary files of the interrupted write) is passed over with a warning for the newest
        folder beside it that holds a complete state. The main process decides; every process
        follows.
        """
        found = _newest_complete_sibling(directory) if self.strategy.is_global_zero else None
        if self.strategy.world_size > 1:
            found = self.strategy.broadcast(found)
        if found is None:
            return directory
        if self.strategy.is_global_zero:
            warnings.warn(
                f"load_state('{directory}'): that folder holds no complete state; a save_state into it was "
                f"interrupted (the process was killed while saving). Loading the newest complete state beside it "
                f"instead: '{found}'.",
                UserWarning,
                stacklevel=3,
            )
        return found

    def _refuse_unprepared_optimizers(self) -> None:
        """An optimizer that steps a prepared model but was never prepared would be left out silently.

        Looked for at the first save_state after the prepared objects change (the search walks
        every object of the process, ~0.1 s): training code makes its optimizers before then.
        """
        prepared = (
            *map(id, self.objects.models),
            *map(id, self.objects.optimizers),
            *map(id, self.objects.custom_objects),
        )
        if self._optimizers_checked_for == prepared:
            return
        missing = _unprepared_optimizers(
            self.objects.models, self.objects.optimizers, self.objects.custom_objects
        )
        if not missing:
            self._optimizers_checked_for = prepared
        if missing:
            names = ", ".join(type(optimizer).__name__ for optimizer in missing)
            raise ValueError(
                f"save_state() would leave out {names}: it holds parameters of a prepared model but was not passed "
                f"to accelerator.prepare(), so a resumed run would restart it from scratch. Prepare it "
                f"(model, optimizer = accelerator.prepare(model, optimizer)), or register it for checkpointing "
                f"(accelerator.register_for_checkpointing(optimizer))."
            )

    # -- hooks ----------------------------------------------------------------------------------
    def register_save_state_pre_hook(
        self, hook: Callable[[list[nn.Module], list[dict[str, Any]], str], None]
    ) -> Any:
        """See :meth:`drivetrain.Accelerator.register_save_state_pre_hook`."""
        return self._register_hook(self._save_state_hooks, hook)

    def register_load_state_pre_hook(self, hook: Callable[[list[nn.Module], str], None]) -> Any:
        """See :meth:`drivetrain.Accelerator.register_load_state_pre_hook`."""
        return self._register_hook(self._load_state_hooks, hook)

    def _register_hook(self, hooks: OrderedDict[int, Callable[..., None]], hook: Callable[..., None]) -> Any:
        from torch.utils.hooks import RemovableHandle

        if not callable(hook):
            raise TypeError(f"A state hook must be callable, got {type(hook).__name__}.")
        if self.strategy.requires_joint_setup:
            raise ValueError(
                f"Save/load state hooks see each model's whole state dict, which {type(self.strategy).__name__} keeps "
                f"sharded; they are supported with single-device and DDP strategies."
            )
        handle = RemovableHandle(hooks)
        hooks[handle.id] = hook
        return handle

    def _run_save_hooks(self, output_dir: str) -> list[Any]:
        models = list(self.objects.models)
        weights = [self.strategy.get_module_state_dict(model) for model in models]
        for hook in list(self._save_state_hooks.values()):
            hook(models, weights, output_dir)
        return weights

    def _run_load_hooks(self, input_dir: str) -> list[nn.Module]:
        models = list(self.objects.models)
        for hook in list(self._load_state_hooks.values()):
            hook(models, input_dir)
        return models

    def _map_location(self, value: Any) -> Any:
        """Accelerate's ``map_location`` values: ``None``, ``"cpu"``, ``"on_device"`` (this process's device)."""
        if value is None or value == "cpu":
            return value
        if value == "on_device":
            return self.strategy.root_device
        # A TypeError, as Accelerate raises for it.
        raise TypeError(
            f"load_state(map_location={value!r}) is not supported; use None (where the tensors were saved from), "
            f"'cpu' or 'on_device' (this process's device)."
        )

    def _training_objects(self) -> TrainingObjects:
        from drivetrain.strategies.checkpointing import TrainingObjects

        return TrainingObjects(
            models=self.objects.models,
            optimizers=[optimizer.optimizer for optimizer in self.objects.optimizers],
            schedulers=self.objects.schedulers,
            dataloaders=self.objects.dataloaders,
            mid_window=self.gradient_state.mid_window,
        )

    # -- automatic naming ---------------------------------------------------------------------
    def _next_automatic_dir(self) -> str:
        from drivetrain.plugins.io.atomic import remove

        config = self.project_configuration
        if not config.automatic_checkpoint_naming:
            raise ValueError(
                "save_state() needs a directory: pass save_state(output_dir), or turn on "
                "ProjectConfiguration(automatic_checkpoint_naming=True) with a project_dir."
            )
        root = _checkpoints_root(config)
        target = paths.join(root, f"checkpoint_{config.iteration}")
        # Rank 0 looks and every rank follows its answer: a rank that looked itself after rank 0
        # removed a leftover would skip the barrier below and leave the others waiting in it.
        found = None
        if self.strategy.is_global_zero and paths.exists(target):
            found = "complete" if _holds_complete_state(target) else "leftover"
        if self.strategy.world_size > 1:
            found = self.strategy.broadcast(found)
        if found == "complete":
            raise ValueError(
                f"The checkpoint directory '{target}' already exists; set ProjectConfiguration(iteration=...) "
                f"past the existing checkpoints, or remove it."
            )
        if (
            found == "leftover"
        ):  # left by a save that crashed (a resumed run counts on from the newest complete one)
            if self.strategy.is_global_zero:
                remove(target)
            self.strategy.barrier("drivetrain.Accelerator.save_state.clear")
        return target

    def _latest_automatic_dir(self) -> str:
        config = self.project_configuration
        if not config.automatic_checkpoint_naming:
            raise ValueError(
                "load_state() needs a directory: pass load_state(input_dir), or turn on "
                "ProjectConfiguration(automatic_checkpoint_naming=True) to load the latest automatic checkpoint."
            )
        root = _checkpoints_root(config)
        existing = [path for _, path in reversed(_existing(root))]
        for index, path in enumerate(existing):
            if _holds_complete_state(path):
                if index and self.strategy.is_global_zero:
                    skipped = ", ".join(f"'{paths.name(p)}'" for p in existing[:index])
                    warnings.warn(
                        f"Skipping incomplete automatic checkpoint(s) {skipped} under '{root}' (a save was "
                        f"interrupted); loading '{paths.name(path)}'.",
                        UserWarning,
                        stacklevel=3,
                    )
                return path
        raise FileNotFoundError(f"No complete automatic checkpoint under '{root}' to load.")


def _check_registered_objects(directory: str, rest: dict[str, Any], registered: int) -> None:
    """Refuse a state with more registered objects than are registered now: a subset would load silently."""
    saved = [key for key in rest if _CUSTOM.match(key)]
    if saved:
        raise ValueError(
            f"The state in '{directory}' holds {registered + len(saved)} objects registered with "
            f"register_for_checkpointing (registered now: {registered}): loading it would leave "
            f"{', '.join(map(repr, sorted(saved)))} unrestored. Register the same objects, in the same order, "
            f"before load_state."
        )


def _unprepared_optimizers(
    models: list[nn.Module], prepared: list[Any], registered: list[Any]
) -> list[Optimizer]:
    """Live optimizers over a prepared model's parameters that are neither prepared nor registered.

    The Accelerator only knows what went through ``prepare``; the garbage collector knows every
    optimizer of the process. Looked up when a state is saved, never on the step path.
    """
    parameters = {id(p) for model in models for p in model.parameters()}
    known = {id(p) for p in prepared} | {id(p.optimizer) for p in prepared} | {id(obj) for obj in registered}
    return [
        obj
        for obj in gc.get_objects()
        if issubclass(
            type(obj), Optimizer
        )  # type(), not isinstance: no attribute access on arbitrary objects
        and id(obj) not in known
        and any(id(p) in parameters for group in obj.param_groups for p in group["params"])
    ]


def _checkpoints_root(config: ProjectConfiguration) -> str:
    if config.project_dir is None:
        raise ValueError(
            "Automatic checkpoint naming needs a project directory: Accelerator(project_dir=...) or "
            "ProjectConfiguration(project_dir=..., automatic_checkpoint_naming=True)."
        )
    return paths.join(config.project_dir, "checkpoints")


def _existing(root: str) -> list[tuple[int, str]]:
    """The automatic checkpoint folders under ``root`` (local or remote), oldest first."""
    found = [
        (int(m.group(1)), paths.join(root, name))
        for name in paths.listdir(root)
        if (m := _CHECKPOINT_DIR.match(name))
    ]
    return sorted(found)


def _newest_complete_sibling(directory: str) -> str | None:
    """The newest folder beside ``directory`` with a complete state, if ``directory`` is what a killed save left."""
    from drivetrain.plugins.io.atomic import is_temporary, resolve

    if not _interrupted(directory):
        return None  # the caller says what is wrong
    parent = paths.parent(directory)
    found = [
        (paths.modified(state), folder)
        for name in paths.listdir(parent)
        if not is_temporary(name)
        and (folder := paths.join(parent, name)) != directory
        and paths.isdir(folder)
        and _holds_complete_state(folder)
        and (state := resolve(paths.join(folder, STATE_FILE))) is not None
    ]
    return max(found)[1] if found else None


def _interrupted(directory: str) -> bool:
    """Whether ``directory`` is a folder a killed save left: nothing in it but temporary files (or nothing)."""
    from drivetrain.plugins.io.atomic import is_temporary

    return paths.isdir(directory) and all(is_temporary(name) for name in paths.listdir(directory))


def _holds_complete_state(directory: str) -> bool:
    from drivetrain.plugins.io.atomic import is_complete, resolve

    path = resolve(paths.join(directory, STATE_FILE))
    return path is not None and is_complete(path)


def _prune_automatic(root: str, keep: int | None, newest: str) -> None:
    """Remove what crashed saves left and, past ``keep``, the oldest checkpoints (after ``newest`` is published)."""
    from drivetrain.plugins.io.atomic import being_written, remove, tidy

    tidy(root)  # what a crash left here (a checkpoint half deleted); the save itself tidied its own folder
    existing = [path for _, path in _existing(root) if path != newest]
    complete = [path for path in existing if _holds_complete_state(path)]
    # An incomplete one is a crash's leftover, unless another run saving here is writing it right now.
    doomed = [path for path in existing if path not in complete and not being_written(path)]
    if keep is not None:
        doomed += complete[: max(0, len(complete) + 1 - keep)]
    for path in doomed:
        remove(path)


def _no_model_kwargs(method: str, kwargs: dict[str, Any]) -> None:
    if kwargs:
        raise TypeError(
            f"{method}() got {', '.join(map(repr, kwargs))}: drivetrain saves models through the strategy and takes "
            f"no model-saving options here."
        )


def _weights_only(load_kwargs: dict[str, Any] | None) -> bool:
    if load_kwargs is None:
        return True
    if not isinstance(load_kwargs, dict):
        raise TypeError(f"load_state(load_kwargs=...) expects a dict, got {type(load_kwargs).__name__}.")
    unknown = sorted(set(load_kwargs) - {"weights_only"})
    if unknown:
        raise ValueError(
            f"load_state(load_kwargs=...) got {', '.join(map(repr, unknown))}; drivetrain loads through the "
            f"strategy and takes only 'weights_only' here (e.g. load_kwargs={{'weights_only': False}})."
        )
    value = load_kwargs.get("weights_only", True)
    if not isinstance(value, bool):
        raise TypeError(f"load_state(load_kwargs={{'weights_only': {value!r}}}): use True or False.")
    return value


def _pretty_name(obj: Any) -> str:
    """``obj``'s qualified name, or its class's (``Tensor`` for a tensor)."""
    named = obj if hasattr(obj, "__qualname__") or hasattr(obj, "__name__") else type(obj)
    return str(getattr(named, "__qualname__", getattr(named, "__name__", named)))
