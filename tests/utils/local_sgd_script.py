"""LocalSGD on 2 processes: different data per rank, weights equal after every averaging step.

Writes ``OUT/rank<R>.json`` with the weights after each step (``OUT``: the first argument).
"""

import json
import sys
from pathlib import Path

import torch
from torch import nn

import drivetrain as dt
from drivetrain.utils import LocalSGD

out = Path(sys.argv[1])
accelerator = dt.Accelerator(cpu=True)
torch.manual_seed(0)
model = nn.Linear(3, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
model, optimizer = accelerator.prepare(model, optimizer)
generator = torch.Generator().manual_seed(100 + accelerator.process_index)  # each rank its own data
steps = []
with LocalSGD(accelerator, model, local_sgd_steps=2) as local_sgd:
    for _ in range(4):
        inputs = torch.randn(4, 3, generator=generator)
        loss = model(inputs).pow(2).mean()
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        local_sgd.step()
        steps.append(accelerator.unwrap_model(model).weight.detach().flatten().tolist())
(out / f"rank{accelerator.process_index}.json").write_text(json.dumps(steps))
