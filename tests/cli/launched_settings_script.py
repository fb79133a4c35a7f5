"""Reports what ``drivetrain launch``'s settings became in the script's Accelerator and Trainer.

Writes ``OUT/rank<R>.json`` (``OUT``: the first argument). With ``explicit`` as its second
argument the script sets its own precision and accumulation (which then win over the
launcher's, with a warning).
"""

import json
import os
import sys
import warnings
from pathlib import Path

import drivetrain as dt

out = Path(sys.argv[1])
explicit = sys.argv[2:] == ["explicit"]
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    if explicit:
        accelerator = dt.Accelerator(mixed_precision="no", gradient_accumulation_steps=5)
        trainer = dt.Trainer(
            precision="32-true", accumulate_grad_batches=5, logger=False, enable_progress_bar=False
        )
    else:
        accelerator = dt.Accelerator()
        trainer = dt.Trainer(logger=False, enable_progress_bar=False)
(out / f"rank{accelerator.process_index}.json").write_text(
    json.dumps(
        {
            "rank": accelerator.process_index,
            "master_addr": os.environ.get("MASTER_ADDR"),
            "master_port": os.environ.get("MASTER_PORT"),
            "world": accelerator.num_processes,
            "device": accelerator.device.type,
            "mixed_precision": accelerator.mixed_precision,
            "accumulation": accelerator.gradient_accumulation_steps,
            "trainer_precision": trainer.precision,
            "trainer_accumulation": trainer.accumulate_grad_batches,
            "warnings": sorted(
                {str(w.message).split(";")[0] for w in caught if "drivetrain launch" in str(w.message)}
            ),
        }
    )
)
