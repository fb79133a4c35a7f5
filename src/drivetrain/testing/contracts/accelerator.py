"""The hardware accelerator's contract: the seeds' static methods and every hook the core calls."""

from __future__ import annotations

import inspect
from typing import Any

from drivetrain.accelerators import Accelerator, AcceleratorRegistry, devices_for
from drivetrain.testing.contracts import Check, NotApplicable, same, weights_only_round_trip
from drivetrain.testing.fake import original_class
from drivetrain.testing.stand_ins import StandIn

_SEED_METHODS = ("parse_devices", "get_parallel_devices", "auto_device_count", "is_available")


def registered_names(cls: type) -> list[str]:
    """The accelerator registry's names for ``cls`` (or a fake of it)."""
    return [entry.name for entry in AcceleratorRegistry.describe() if original_class(entry.cls) is cls]


def accelerator_checks(
    cls: Any, devices: int, stand_in: StandIn | None, fake: bool, forced: type[Accelerator] | None = None
) -> list[Check]:
    """The checks for the accelerator class ``cls`` with ``devices`` devices, its library stood in for if given.

    Args:
        forced: the fake of ``cls`` that answers availability itself (``fake=True`` without a stand-in for
            an absent library): instances are made from it, and availability is not checked.
    """
    state: dict[str, Any] = {}
    unforced = NotApplicable(
        "the device library is absent and no stand-in was given, so the kit answered availability itself "
        "(fake=True); pass stand_in= to check it"
    )

    def subclass() -> str | None:
        if not (isinstance(cls, type) and issubclass(cls, Accelerator)):
            return f"{cls!r} is not a subclass of drivetrain.accelerators.Accelerator"
        missing = sorted(getattr(cls, "__abstractmethods__", ()))
        if missing:
            return f"{cls.__name__} does not implement {', '.join(missing)}"
        return None

    def static_methods() -> str | None:
        wrong = [
            name for name in _SEED_METHODS if not isinstance(inspect.getattr_static(cls, name), staticmethod)
        ]
        if wrong:
            return f"{', '.join(wrong)} must be static methods (drivetrain calls them on the class, before any instance)"
        return None

    def available() -> str | NotApplicable | None:
        if forced is not None:
            return unforced
        answer = cls.is_available()
        if not isinstance(answer, bool):
            return f"is_available() returned {answer!r}, not True or False"
        if not answer:
            where = "with its stand-in in place" if stand_in is not None else "here"
            return f"is_available() is False {where} (unavailable_reason(): {cls.unavailable_reason()})"
        return None

    def count() -> str | NotApplicable | None:
        if forced is not None:
            state["count"] = devices
            return unforced
        found = cls.auto_device_count()
        if isinstance(found, bool) or not isinstance(found, int) or found < 1:
            return f"auto_device_count() returned {found!r} while is_available() is True; it must be the number of devices (>= 1)"
        state["count"] = found
        return None

    def parallel_devices() -> str | None:
        instance = (forced or cls)()
        state["instance"] = instance
        wanted = min(devices, state.get("count", devices))
        lists = {n: devices_for(instance, n) for n in sorted({1, wanted})}
        for n, found in lists.items():
            if len(found) != n:
                return f"devices={n} gave {len(found)} devices ({found}); one device per process is expected"
        kinds = {device.type for found in lists.values() for device in found}
        if len(kinds) != 1:
            return f"get_parallel_devices gave devices of several types: {sorted(kinds)}"
        state["devices"] = lists[wanted]
        return None

    def auto_devices() -> str | None:
        found = devices_for(state["instance"], "auto")
        if len(found) != state["count"]:
            return f"devices='auto' gave {len(found)} devices, but auto_device_count() is {state['count']}"
        return None

    def setup_device() -> str | None:
        for device in state["devices"]:
            state["instance"].setup_device(device)
        return None

    def device_stats() -> str | None:
        stats = state["instance"].get_device_stats(state["devices"][0])
        if not isinstance(stats, dict) or not all(isinstance(k, str) for k in stats):
            return f"get_device_stats() returned {type(stats).__name__}, not a dict with string keys"
        return None

    def generators() -> str | NotApplicable | None:
        instance = state["instance"]
        saved = instance.get_rng_state()
        has_own = stand_in is not None or (not fake and state["devices"][0].type != "cpu")
        if saved is None:
            if has_own:
                where = (
                    f"the {stand_in.library} stand-in keeps one per device"
                    if stand_in
                    else "the device has its own"
                )
                return (
                    f"get_rng_state() returns None, but the device has random generators of its own ({where}): a "
                    f"resumed run would draw different random numbers on the device"
                )
            if state["devices"][0].type == "cpu":
                return NotApplicable(
                    "get_rng_state() returns None: the CPU's generator is torch's, which checkpoints save anyway"
                )
            return NotApplicable(
                "get_rng_state() returns None: the device keeps no generator state of its own here (if yours "
                "does, implement get_rng_state/set_rng_state and run with fake=False on the hardware)"
            )
        if type(instance).set_rng_state is Accelerator.set_rng_state:
            return (
                "get_rng_state() is overridden but set_rng_state() is not: the saved state is never restored"
            )
        try:
            loaded = weights_only_round_trip(saved)
        except Exception as error:
            return f"get_rng_state() returned {type(saved).__name__}, which checkpoints cannot hold ({type(error).__name__}: {error})"
        if stand_in is not None:
            stand_in.draw()  # move the generator, so that restoring it shows
        instance.set_rng_state(loaded)
        if not same(instance.get_rng_state(), saved):
            return "set_rng_state(get_rng_state()) did not bring the generator back to the saved state"
        return None

    def registered() -> str | None:
        names = registered_names(cls)
        if not names:
            return f"{cls.__name__} is not registered under a short name"
        state["names"] = names
        return None

    def strategy_choice() -> str | None:
        choice = state["instance"].auto_strategy(2)
        if choice is not None:
            from drivetrain.strategies import StrategyRegistry

            if choice not in StrategyRegistry:
                return f"auto_strategy(2) names {choice!r}, which no strategy is registered under"
        return None

    return [
        Check(
            "accelerator: subclasses Accelerator and implements it",
            subclass,
            "subclass drivetrain.accelerators.Accelerator and define parse_devices, get_parallel_devices, auto_device_count and is_available",
            essential=True,
        ),
        Check(
            "accelerator: the seeds' four methods are static",
            static_methods,
            "decorate them with @staticmethod, as the seeds' example does",
        ),
        Check(
            "accelerator: is_available() answers",
            available,
            "return True where the hardware can be used (with fake=True, against the stand-in of its library), and override unavailable_reason() to say what is missing",
            essential=True,
        ),
        Check(
            "accelerator: auto_device_count() counts the devices",
            count,
            "return how many devices devices='auto' means, as an int",
        ),
        Check(
            "accelerator: get_parallel_devices() gives one torch.device per process",
            parallel_devices,
            "return a list of torch.device, one per process, e.g. [torch.device('xpu', i) for i in indices]; parse_devices must accept a count",
            essential=True,
        ),
        Check(
            "accelerator: devices='auto' uses auto_device_count()",
            auto_devices,
            "make parse_devices accept the count auto_device_count() returns",
        ),
        Check(
            "accelerator: setup_device() accepts its own devices",
            setup_device,
            "accept every device get_parallel_devices returns (select it, or check its type)",
        ),
        Check(
            "accelerator: get_device_stats() returns a dict",
            device_stats,
            "return a dict of figures with string keys (an empty dict is fine)",
        ),
        Check(
            "accelerator: random generators saved and restored",
            generators,
            "implement get_rng_state() (plain tensors, numbers, lists, dicts) and set_rng_state(state) that restores it",
        ),
        Check(
            "accelerator: registered under a short name",
            registered,
            "define the classmethod register_accelerators(cls, accelerator_registry) calling accelerator_registry.register('name', cls, description=...)",
        ),
        Check(
            "accelerator: auto_strategy() names a registered strategy",
            strategy_choice,
            "return None or the name of a registered strategy",
        ),
    ]
