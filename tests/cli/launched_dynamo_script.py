"""Reports how ``drivetrain launch --dynamo_*`` reached the script's Accelerator (and the Trainer's warning).

Writes ``OUT/rank<R>.json`` (``OUT``: the first argument) after one compiled training step.
"""

import json
import sys
import warnings
from pathlib import Path

import torch
from torch import nn

import drivetrain as dt
from drivetrain.utils import is_compiled_module

out = Path(sys.argv[1])
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    accelerator = dt.Accelerator()
    dt.Trainer(logger=False, enable_progress_bar=False)
model = nn.Linear(3, 1)
model, optimizer = accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
accelerator.backward(model(torch.ones(2, 3)).sum())
optimizer.step()
plugin = accelerator.state.dynamo_plugin
(out / f"rank{accelerator.process_index}.json").write_text(
    json.dumps(
        {
            "world": accelerator.num_processes,
            "backend": str(plugin.backend.value if hasattr(plugin.backend, "value") else plugin.backend),
            "mode": plugin.mode,
            "fullgraph": plugin.fullgraph,
            "dynamic": plugin.dynamic,
            "compiled": is_compiled_module(model),
            "wrapped": type(model._orig_mod).__name__,
            "trainer_warned": any("the Trainer does not read it" in str(w.message) for w in caught),
        }
    )
)
