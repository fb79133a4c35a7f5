"""Two CUDA ranks started by the Accelerator itself (plain ``python two_gpus.py``)."""

import os

import torch

import drivetrain as dt

accelerator = dt.Accelerator(devices=2)
model = accelerator.prepare(torch.nn.Linear(2, 2))
total = accelerator.reduce(torch.ones(1, device=accelerator.device)).item()
gathered = accelerator.gather(torch.tensor([accelerator.process_index], device=accelerator.device)).tolist()
line = f"ranks={accelerator.num_processes} device={accelerator.device} total={total} gathered={gathered}\n"
os.write(1, line.encode())  # one write per line: the ranks share stdout
