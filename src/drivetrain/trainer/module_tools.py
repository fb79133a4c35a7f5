"""What a ``TrainingModule`` offers beyond its recipe: freezing, optimizer toggling, an example input, export.

Kept out of :mod:`drivetrain.trainer.module` so the recipe and its hooks read on their own;
:class:`~drivetrain.TrainingModule` inherits these methods (Lightning's names and behaviour).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from drivetrain._utilities.apply import move_to_device

if TYPE_CHECKING:
    from drivetrain.trainer.trainer import Trainer


def _unwrap(optimizer: Any) -> Any:
    """The torch optimizer behind what ``self.optimizers()`` returned."""
    return getattr(optimizer, "optimizer", optimizer)


class ModuleTools(nn.Module):
    """Freezing, optimizer toggling, ``example_input_array``, TorchScript and ONNX export."""

    if TYPE_CHECKING:

        @property
        def trainer(self) -> Trainer: ...

    #: ``False`` to load checkpoints whose keys differ from the module's (missing or extra weights
    #: are left as they are); used by ``load_from_checkpoint`` when it is not given ``strict``.
    strict_loading: bool = True

    # -- freezing ---------------------------------------------------------------------------------
    def freeze(self) -> None:
        """Stop every parameter from training (``requires_grad=False``) and switch to eval mode."""
        for parameter in self.parameters():
            parameter.requires_grad = False
        self.eval()

    def unfreeze(self) -> None:
        """Let every parameter train again (``requires_grad=True``) and switch to train mode."""
        for parameter in self.parameters():
            parameter.requires_grad = True
        self.train()

    # -- several optimizers -------------------------------------------------------------------------
    def toggle_optimizer(self, optimizer: Any) -> None:
        """Compute gradients only for ``optimizer``'s parameters until :meth:`untoggle_optimizer`.

        With several optimizers (a GAN's generator and discriminator), the other optimizers'
        parameters get ``requires_grad=False`` so a backward pass leaves their gradients alone; the
        previous flags are remembered and restored by :meth:`untoggle_optimizer`.
        """
        current = _unwrap(optimizer)
        remembered: dict[nn.Parameter, bool] = {}
        for other in self.trainer.optimizers:
            for group in other.param_groups:
                for parameter in group["params"]:
                    if parameter not in remembered:
                        remembered[parameter] = parameter.requires_grad
                        parameter.requires_grad = False
        for group in current.param_groups:
            for parameter in group["params"]:
                parameter.requires_grad = remembered.get(parameter, parameter.requires_grad)
        self.__dict__["_toggled_requires_grad"] = remembered

    def untoggle_optimizer(self, optimizer: Any) -> None:
        """Give the other optimizers' parameters back the ``requires_grad`` they had before :meth:`toggle_optimizer`."""
        current = _unwrap(optimizer)
        remembered: dict[nn.Parameter, bool] = self.__dict__.pop("_toggled_requires_grad", {})
        for other in self.trainer.optimizers:
            if other is current:
                continue
            for group in other.param_groups:
                for parameter in group["params"]:
                    if parameter in remembered:
                        parameter.requires_grad = remembered[parameter]

    @contextlib.contextmanager
    def toggled_optimizer(self, optimizer: Any) -> Iterator[None]:
        """:meth:`toggle_optimizer` for the ``with`` block, then :meth:`untoggle_optimizer`."""
        self.toggle_optimizer(optimizer)
        try:
            yield
        finally:
            self.untoggle_optimizer(optimizer)

    # -- an example input -------------------------------------------------------------------------
    @property
    def example_input_array(self) -> Any:
        """An input for ``forward`` (a tensor, a tuple of positional inputs or a dict of keyword inputs).

        When set, the model summary runs it through the module and shows each layer's input and
        output sizes, and :meth:`to_torchscript` (``method="trace"``) and :meth:`to_onnx` use it.
        """
        return self.__dict__.get("_example_input_array")

    @example_input_array.setter
    def example_input_array(self, example: Any) -> None:
        self.__dict__["_example_input_array"] = example

    def _example_input(self, given: Any, caller: str, argument: str) -> Any:
        example = given if given is not None else self.example_input_array
        if example is None:
            raise ValueError(
                f"{type(self).__name__}.{caller} needs an input to run the module with: pass {argument}=..., or set "
                f"self.example_input_array in __init__."
            )
        return example

    # -- export -------------------------------------------------------------------------------------
    def to_torchscript(
        self,
        file_path: str | Path | None = None,
        method: str = "script",
        example_inputs: Any = None,
        **kwargs: Any,
    ) -> Any:
        """The module as TorchScript (``torch.jit.script`` or ``torch.jit.trace``), in eval mode.

        Args:
            file_path: also save it there (``torch.jit.save``).
            method: ``"script"`` (compile the code) or ``"trace"`` (record one run with ``example_inputs``).
            example_inputs: the input to trace with (default: :attr:`example_input_array`).
            **kwargs: passed to ``torch.jit.script``/``torch.jit.trace``.

        Torch deprecates TorchScript in favour of ``torch.export``; this stays for programs that use it.
        """
        if method not in ("script", "trace"):
            raise ValueError(f"to_torchscript(method={method!r}); use 'script' or 'trace'.")
        mode = self.training
        # torch.jit.script reads every attribute of the class; self.trainer must not raise meanwhile.
        self.__dict__["_jit_is_scripting"] = True
        try:
            if method == "script":
                exported = torch.jit.script(self.eval(), **kwargs)
            else:
                example = self._example_input(
                    example_inputs, "to_torchscript(method='trace')", "example_inputs"
                )
                exported = torch.jit.trace(self.eval(), example_inputs=_as_device(example, self), **kwargs)
        finally:
            self.__dict__["_jit_is_scripting"] = False
            self.train(mode)
        if file_path is not None:
            torch.jit.save(exported, os.fspath(file_path))
        return exported

    def to_onnx(self, file_path: str | Path, input_sample: Any = None, **kwargs: Any) -> Any:
        """Export the module to ONNX at ``file_path`` with ``torch.onnx.export``, in eval mode.

        Args:
            file_path: where the ``.onnx`` file goes.
            input_sample: the input to export with (default: :attr:`example_input_array`).
            **kwargs: passed to ``torch.onnx.export`` (``dynamo=``, ``input_names=`` …).

        Raises:
            ModuleNotFoundError: torch's exporter needs the ``onnx`` package (and ``onnxscript``
                for the default exporter), which is not installed.
        """
        missing = [name for name in ("onnx", "onnxscript") if importlib.util.find_spec(name) is None]
        if missing:
            raise ModuleNotFoundError(
                f"to_onnx() uses torch.onnx.export, which needs {' and '.join(missing)}: pip install "
                f"{' '.join(missing)}"
            )
        example = self._example_input(input_sample, "to_onnx()", "input_sample")
        example = _as_device(example, self)
        args = example if isinstance(example, tuple) else (example,)
        mode = self.training
        try:
            return torch.onnx.export(self.eval(), args, os.fspath(file_path), **kwargs)
        finally:
            self.train(mode)


def _as_device(example: Any, module: nn.Module) -> Any:
    """``example`` on the module's device (tensors inside tuples, lists and dicts too)."""

    device = next((p.device for p in module.parameters()), None)
    return move_to_device(example, device) if device is not None else example
