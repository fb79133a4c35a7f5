"""Interactive sessions (notebooks, IPython, ``python -i``): strategies that re-run the program are refused.

The session is a real interactive interpreter (``python -i`` reading its statements from a pipe,
so ``sys.ps1`` is set as at any prompt), not a patched flag: the refusal must come when the
Trainer or the Accelerator is built, before any process is started, and the fix it names
(``ddp_notebook``, which ``"auto"`` also picks there) must train.
"""

from __future__ import annotations

import sys
import types

import pytest

import drivetrain as dt
from helpers.scripts import run_script

# Statements as typed at the prompt: blank lines close the blocks.
SESSION = """
import psutil, torch, drivetrain as dt
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
class Net(dt.TrainingModule):
    def __init__(self):
        super().__init__()
        self.layer = nn.Linear(4, 1)
    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self.layer(x), y)
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

def refused(make):
    try:
        make()
    except ValueError as error:
        return str(error)
    return "accepted"

print("TRAINER_DDP:", refused(lambda: dt.Trainer(accelerator="cpu", strategy="ddp", devices=2)))
print("TRAINER_SPAWN:", refused(lambda: dt.Trainer(accelerator="cpu", strategy="ddp_spawn", devices=2)))
print("ACCELERATOR_DDP:", refused(lambda: dt.Accelerator(cpu=True, strategy="ddp", devices=2)))
print("CHILDREN:", len(psutil.Process().children(recursive=True)))
print("ONE_DEVICE:", refused(lambda: dt.Trainer(accelerator="cpu", devices=1)))
trainer = dt.Trainer(accelerator="cpu", devices=2, max_steps=3, logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
print("AUTO:", type(trainer.strategy).__name__, trainer.strategy.start_method)
torch.manual_seed(0)
model = Net()
before = model.layer.weight.detach().clone()
data = DataLoader(TensorDataset(torch.randn(32, 4), torch.randn(32, 1)), batch_size=4)
trainer.fit(model, data)
print("FIT:", trainer.global_step, not torch.equal(before, model.layer.weight))
"""


@pytest.mark.multiprocess
def test_a_python_prompt_refuses_rerun_strategies_and_trains_with_ddp_notebook() -> None:
    result = run_script(["-i", "-q"], stdin=SESSION, timeout=240)
    lines = {
        line.split(":", 1)[0]: line.split(":", 1)[1].strip()
        for line in result.stdout.splitlines()
        if ":" in line
    }
    context = f"--- stdout ---\n{result.stdout}\n--- stderr ---\n{result.stderr}"
    assert lines.get("TRAINER_DDP", "").startswith(
        "strategy='ddp' starts its other processes by re-running this program's command line, which from an "
        "interactive session starts another interpreter (or notebook kernel)"
    ), context
    assert "Use strategy='ddp_notebook'" in lines["TRAINER_DDP"], context
    assert lines.get("TRAINER_SPAWN", "").startswith(
        "strategy='ddp_spawn' starts its processes with the 'spawn'"
    ), context
    assert lines.get("ACCELERATOR_DDP", "").startswith(
        "strategy='ddp' starts its other processes by re-running"
    ), context
    assert lines.get("CHILDREN") == "0", context  # refused before anything was started
    assert lines.get("ONE_DEVICE") == "accepted", context
    assert lines.get("AUTO") == "DDPStrategy fork", context  # "auto" picks ddp_notebook at a prompt
    assert lines.get("FIT") == "3 True", context  # forked ranks trained; the result came back


def test_a_jupyter_kernel_is_recognised(monkeypatch: pytest.MonkeyPatch) -> None:
    # A Jupyter kernel need not set sys.ps1; its ipykernel module in sys.modules gives it away.
    monkeypatch.delattr(sys, "ps1", raising=False)
    dt.connect(accelerator="cpu", strategy="ddp", devices=2)  # a script: fine
    monkeypatch.setitem(sys.modules, "ipykernel", types.ModuleType("ipykernel"))
    with pytest.raises(ValueError, match=r"strategy='ddp' starts its other processes by re-running"):
        dt.connect(accelerator="cpu", strategy="ddp", devices=2)
    assert dt.connect(accelerator="cpu", strategy="ddp_notebook", devices=2).start_method == "fork"
