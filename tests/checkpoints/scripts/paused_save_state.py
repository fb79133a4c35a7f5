"""An Accelerator saving automatic checkpoints into a project folder, paused in the middle of its first write.

    python paused_save_state.py PROJECT_DIR GATE_DIR

Once the state file is being written it creates ``GATE_DIR/writing`` and waits for
``GATE_DIR/go``; then it prints ``saved <folder>``, or the error the save ended with.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

import drivetrain as dt
from drivetrain.utils import ProjectConfiguration

GATE = Path(sys.argv[2])


class Gate:
    """Pickled while the state file is open: the save pauses there until the test lets it go on."""

    def __reduce__(self) -> Any:
        (GATE / "writing").write_text("")
        while not (GATE / "go").exists():
            time.sleep(0.02)
        return (int, (0,))


class Paused:
    def state_dict(self) -> dict[str, Any]:
        return {"gate": Gate()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


def main() -> None:
    config = ProjectConfiguration(project_dir=sys.argv[1], automatic_checkpoint_naming=True, total_limit=1)
    accelerator = dt.Accelerator(cpu=True, project_config=config)
    model = nn.Linear(4, 1)
    model, _optimizer = accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    accelerator.register_for_checkpointing(Paused())
    try:
        print(f"saved {accelerator.save_state()}", flush=True)
    except Exception as error:
        print(f"{type(error).__name__}: {error}", flush=True)


if __name__ == "__main__":
    main()
