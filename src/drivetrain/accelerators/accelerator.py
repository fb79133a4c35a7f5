"""The hardware plugin interface: what a Strategy needs to know about a kind of device."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import torch

from drivetrain._utilities.renamed import sync_renamed_hooks


class Accelerator(ABC):
    """Connects drivetrain to one kind of hardware.

    Subclasses implement the four static methods below; everything else has a working default.
    Defining the classmethod :meth:`register_accelerators` on a subclass is enough for its short
    name to work everywhere a string is accepted: the class registers itself when it is created.
    """

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "register_accelerators" in cls.__dict__:
            from drivetrain.accelerators.registry import AcceleratorRegistry

            cls.register_accelerators(AcceleratorRegistry)
        sync_renamed_hooks(cls, {"_unavailable_reason": "unavailable_reason"})

    def __init__(self, **kwargs: Any) -> None:
        if kwargs:
            raise TypeError(_retired_arguments(type(self).__name__, kwargs))

    # -- the seeds' contract ----------------------------------------------------------------
    @staticmethod
    @abstractmethod
    def parse_devices(devices: Any) -> Any:
        """Turn the user's ``devices`` value into this accelerator's device selection."""

    @staticmethod
    @abstractmethod
    def get_parallel_devices(devices: Any) -> list[torch.device]:
        """The ``torch.device`` of each process for a selection from :meth:`parse_devices`."""

    @staticmethod
    @abstractmethod
    def auto_device_count() -> int:
        """How many devices ``devices="auto"`` means."""

    @staticmethod
    @abstractmethod
    def is_available() -> bool:
        """Whether this hardware can be used in this process."""

    def setup_device(self, device: torch.device) -> None:
        """Prepare ``device`` for this process (select it, warm it up)."""

    def setup(self, trainer: Any = None) -> None:
        """Hook for custom strategies (the seeds call ``self.accelerator.setup()``); no-op by default."""

    def teardown(self) -> None:
        """Release what :meth:`setup_device` took."""

    def get_device_stats(self, device: torch.device | str) -> dict[str, Any]:
        """Figures about ``device`` for loggers (memory, utilisation)."""
        return {}

    @classmethod
    def register_accelerators(cls, accelerator_registry: Any) -> None:
        """Register this class under its short name(s); see the class docstring."""

    @classmethod
    def unavailable_reason(cls) -> str:
        """Why :meth:`is_available` is False here, for the error that a request for this hardware gets.

        Override it to name what is missing (a driver, a package, a device) and how to get it.
        """
        return f"{cls.__name__}.is_available() returned False"

    _unavailable_reason = unavailable_reason  # deprecated: the name before it was public

    # -- helpers the strategies use ---------------------------------------------------------
    def synchronize(self, device: torch.device | None = None) -> None:
        """Wait for the work queued on ``device`` (all of this process's, when ``None``) to finish.

        Used for timing; a no-op on synchronous hardware.
        """

    def empty_cache(self) -> None:
        """Give memory that the device's caching allocator holds but does not use back; a no-op by default."""

    def auto_strategy(self, num_processes: int) -> str | None:
        """The registered strategy ``strategy="auto"`` picks on this hardware for ``num_processes`` processes.

        ``None`` (the default): drivetrain's own choice (one device: ``SingleDeviceStrategy``;
        several: ``"ddp"``). Hardware that needs strategies of its own names them here (XLA:
        ``"single_xla"``/``"xla"``; HPU: ``"hpu_single"``/``"hpu_parallel"``).
        """
        return None

    def training_memory(self, device: torch.device) -> tuple[int, str] | None:
        """Bytes one process may fill with its training state on ``device``, and where that figure comes from.

        ``strategy="auto"`` reads it to choose FSDP over DDP when a full copy of the weights,
        gradients and optimizer states per process would not fit. ``None`` (the default): not
        known, and ``"auto"`` stays with DDP.
        """
        return None

    # -- random generators, for checkpoints -------------------------------------------------
    def get_rng_state(self) -> Any:
        """The state of this hardware's own random generators, or ``None`` when it has none.

        The CPU generator (``torch.get_rng_state()``), Python's and NumPy's are captured by the
        checkpoint helper for every device; this hook adds what lives on the device (CUDA's
        per-GPU generators, for example). The value is saved in checkpoints, so it must be made of
        what ``torch.load(weights_only=True)`` reads back: tensors, numbers, strings, and lists,
        tuples and dicts of them. Override it together with :meth:`set_rng_state`.
        """
        return None

    def set_rng_state(self, state: Any) -> None:
        """Restore the generators from what :meth:`get_rng_state` returned in an earlier run.

        Raises:
            NotImplementedError: ``state`` is not ``None`` but this class does not override this
                method (it overrides :meth:`get_rng_state` alone).
        """
        if state is not None:
            raise NotImplementedError(
                f"{type(self).__name__} saved random-generator state with get_rng_state() but does not "
                f"override set_rng_state(state) to restore it. Define both methods on the accelerator."
            )

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


def _retired_arguments(name: str, kwargs: dict[str, Any]) -> str:
    given = ", ".join(f"{key}=..." for key in kwargs)
    if set(kwargs) <= {"precision_plugin", "training_type_plugin"}:
        strategy = "CustomDDPStrategy(accelerator=accelerator"
        if "precision_plugin" in kwargs:
            strategy += ", precision_plugin=CustomPrecisionPlugin()"
        return (
            f"{name}({given}): in Lightning 1.5 the hardware accelerator held the precision and training-type "
            f"plugins; since 1.6 the strategy owns the accelerator and the plugins (training-type plugins became "
            f"strategies). Write: accelerator = {name}(); strategy = {strategy}) with your strategy class in place "
            f"of CustomDDPStrategy, then Trainer(strategy=strategy)."
        )
    return (
        f"{name}({given}): a hardware accelerator takes no arguments unless its class defines them. Define "
        f"__init__ on {name} to take them."
    )
