"""An Accelerate program with a tracker of its own, the same under drivetrain and under Accelerate but for the import.

    python custom_tracker_program.py {drivetrain|accelerate} OUT              # one process
    torchrun --nproc-per-node 2 custom_tracker_program.py {drivetrain|accelerate} OUT

The tracker writes what it receives to ``OUT/records-rank<R>.json`` when it is finished; every
process also writes what the Accelerator showed it (``OUT/seen-rank<R>.json``).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

if sys.argv[1] == "accelerate":
    from accelerate import Accelerator
    from accelerate.tracking import GeneralTracker
else:
    from drivetrain import Accelerator
    from drivetrain.tracking import GeneralTracker


class JsonTracker(GeneralTracker):
    """Keeps every call in a list and writes it as JSON at the end."""

    name = "json_records"
    requires_logging_directory = False

    def __init__(self, folder: Path) -> None:
        super().__init__()
        self.folder = folder
        self.records: list[dict[str, object]] = []

    @property
    def tracker(self) -> list[dict[str, object]]:
        return self.records

    def start(self) -> None:
        self.records.append({"call": "start"})

    def store_init_configuration(self, values: dict[str, object]) -> None:
        self.records.append({"call": "config", "values": values})

    def log(self, values: dict[str, object], step: int | None = None, **kwargs: object) -> None:
        self.records.append({"call": "log", "values": values, "step": step, "kwargs": kwargs})

    def finish(self) -> None:
        self.records.append({"call": "finish"})
        rank = os.environ.get("RANK", "0")
        (self.folder / f"records-rank{rank}.json").write_text(json.dumps(self.records, sort_keys=True))


def main(out: Path) -> None:
    accelerator = Accelerator(log_with=[JsonTracker(out)])
    accelerator.init_trackers("custom", config={"lr": 0.5, "layers": [2, 3], "name": "tiny"})
    for step in range(3):
        values = {"loss": 1.0 / (step + 1), "text": f"step {step}", "nested": {"a": step}}
        accelerator.log(values, step=step, log_kwargs={"json_records": {"commit": step % 2 == 0}})
    found = accelerator.get_tracker("json_records")
    found.log({"direct": 1.0}, step=9)  # a blank tracker off the main process: does nothing
    unwrapped = accelerator.get_tracker("json_records", unwrap=True)
    seen = {
        "trackers": [type(t).__name__ for t in accelerator.trackers],
        "get_tracker": type(found).__name__,
        "unwrap_is_records": unwrapped is getattr(found, "records", None),
    }
    accelerator.end_training()
    (out / f"seen-rank{accelerator.process_index}.json").write_text(json.dumps(seen, sort_keys=True))


if __name__ == "__main__":
    main(Path(sys.argv[2]))
