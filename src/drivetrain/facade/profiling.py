"""``Accelerator.profile``'s ``torch.profiler.profile``, built from a :class:`~drivetrain.utils.ProfileKwargs`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from drivetrain.utils.kwargs_handlers import ProfileKwargs

_ACTIVITIES = {"cpu": "CPU", "cuda": "CUDA", "xpu": "XPU", "mtia": "MTIA"}


def profiler_for(handler: ProfileKwargs | None, device: torch.device) -> Any:
    """A ``torch.profiler.profile`` with the handler's options (default: the CPU and ``device``'s activity).

    Raises:
        ValueError: an activity torch's profiler does not know, or a bad schedule.
    """
    from torch.profiler import ProfilerActivity, profile, schedule

    options = handler.to_kwargs() if handler is not None else {}
    names = options.pop("activities", None) or ["cpu", device.type]
    activities = []
    for name in dict.fromkeys(names):
        member = _ACTIVITIES.get(str(name).lower())
        if member is None or not hasattr(ProfilerActivity, member):
            if name == device.type and name not in _ACTIVITIES:
                continue  # a device the profiler cannot see (mps, meta …): profile the CPU side only
            raise ValueError(
                f"ProfileKwargs(activities=[..., {name!r}]) is not an activity torch's profiler knows; use "
                f"{', '.join(map(repr, _ACTIVITIES))}."
            )
        activities.append(getattr(ProfilerActivity, member))
    options.pop("output_trace_dir", None)  # written by Accelerator.profile after the block
    schedule_option = options.pop("schedule_option", None)
    if schedule_option is not None:
        try:
            options["schedule"] = schedule(**schedule_option)
        except TypeError as error:
            raise ValueError(
                f"ProfileKwargs(schedule_option={schedule_option!r}): {error}. Use torch.profiler.schedule's arguments "
                f"(wait, warmup, active, repeat, skip_first)."
            ) from None
    return profile(activities=activities, **options)
