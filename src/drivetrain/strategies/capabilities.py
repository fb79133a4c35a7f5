"""What a strategy can do, declared once, asked by the front doors and callbacks.

The Trainer, the Accelerator and the built-in callbacks never test which strategy class they
hold (no ``isinstance`` on concrete strategies, no class names, no ``sys.modules``): they read
these declarations. A new strategy states its own here (or inherits its base's) and works in both
front doors without an edit anywhere else; ``docs/extending.md`` lists what each one changes.
"""

from __future__ import annotations

from typing import Any


class StrategyCapabilities:
    """The declarations every :class:`~drivetrain.strategies.Strategy` makes (defaults: one process, one device)."""

    #: The family of distribution, in the words of Accelerate's ``DistributedType`` and of messages:
    #: ``"single_device"``, ``"parallel"`` (data parallel of one's own), ``"ddp"``, ``"fsdp"``,
    #: ``"model_parallel"``, ``"deepspeed"`` or ``"xla"``. ``accelerator.distributed_type`` is
    #: ``DEEPSPEED``/``FSDP``/``XLA`` for those kinds, else ``NO`` or ``MULTI_<device>`` by world size.
    kind: str = "single_device"
    #: The strategy's engine decides when gradients accumulate and when the optimizer steps (DeepSpeed:
    #: ``gradient_accumulation_steps`` in its config): a front door cannot change the factor during a
    #: run, nor drop a step by clearing the gradients before it.
    owns_accumulation: bool = False
    #: ``Accelerator.prepare`` may wrap the set-up models in ``torch.compile`` (``dynamo_backend=``).
    compiles_models: bool = True
    #: Set-up models are the strategy's own wrapper (DDP's), which ``torch.compile`` goes around.
    wraps_models: bool = False

    @property
    def requires_joint_setup(self) -> bool:
        """Whether modules and their optimizers must be set up together (DeepSpeed, FSDP).

        Front doors then call :meth:`setup_module_and_optimizers` with both, and the strategy
        re-points the optimizers at the parameters it created. Callbacks that edit parameters or
        optimizers in place (weight averaging, fine-tuning, pruning) refuse such strategies.
        """
        return False

    @property
    def supports_inference_mode(self) -> bool:
        """Whether evaluation may run under ``torch.inference_mode`` (else ``torch.no_grad``).

        Tensors created under inference mode can never again be updated in place outside it. A
        strategy that creates tensors during a forward pass and keeps them for later ones (FSDP's
        unsharded parameter buffers) must say ``False``, or training after an evaluation fails.
        """
        return True

    @property
    def forward_is_collective(self) -> bool:
        """Whether every forward pass of the set-up model talks to the other processes (sharded
        parameters gathered for it), so all processes must run the same number of forwards."""
        return False

    @property
    def layout_mesh(self) -> Any:
        """The named torch ``DeviceMesh`` of a multi-dimensional parallel layout (data, tensor and
        context parallel), which ``Accelerator.torch_device_mesh`` hands out; ``None`` otherwise."""
        return None
