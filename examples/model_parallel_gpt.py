"""Train a small GPT-style model with tensor parallel x FSDP2 (2 x 2) on 4 CPU processes, through either front door.

Each transformer block's attention (q, k, v column-wise, o row-wise) and MLP (up column-wise,
down row-wise) are split over the 2 ranks of a tensor-parallel group; FSDP2 shards everything
over the 2 data-parallel ranks, and each data-parallel rank reads its own batches (the two ranks
of a tensor-parallel group read the same ones). The same file, started either way::

    python examples/model_parallel_gpt.py --door trainer        # Lightning style: configure_model
    python examples/model_parallel_gpt.py --door accelerator    # Accelerate style: ParallelismConfig + tp_plan
    python examples/model_parallel_gpt.py --door accelerator --replicate 2 --tp 1   # HSDP 2 x 2 instead
    python examples/model_parallel_gpt.py --accelerator cuda --devices 8 --tp 4     # GPUs (NCCL)

Each starts its other 3 processes itself (``devices=4``); under ``drivetrain launch -n 4`` or
``torchrun --nproc-per-node 4`` it joins the processes the launcher started. The task is
learnable (every sequence counts up with its own stride), so the loss falls within a few steps.
``docs/model-parallel.md`` explains each part.
"""

from __future__ import annotations

import argparse
import json
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

import drivetrain as dt
from drivetrain.strategies import ModelParallelStrategy, ParallelLayout

VOCAB, DIM, HEADS, LAYERS, CONTEXT = 64, 64, 4, 2, 32

#: The tensor-parallel plan for ``parallelize_module``: module paths ('*' matches one part) -> style.
TP_PLAN = {
    "blocks.*.q": "colwise",
    "blocks.*.k": "colwise",
    "blocks.*.v": "colwise",
    "blocks.*.o": "rowwise",
    "blocks.*.up": "colwise",
    "blocks.*.down": "rowwise",
}


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.head_dim = DIM // HEADS
        self.norm1, self.norm2 = nn.LayerNorm(DIM), nn.LayerNorm(DIM)
        self.q, self.k, self.v, self.o = (nn.Linear(DIM, DIM) for _ in range(4))
        self.up, self.down = nn.Linear(DIM, 4 * DIM), nn.Linear(4 * DIM, DIM)

    def forward(self, x: Tensor) -> Tensor:
        batch, length, _ = x.shape
        h = self.norm1(x)
        # Under tensor parallelism q/k/v hold this rank's heads only: -1 counts them.
        q, k, v = (
            p(h).view(batch, length, -1, self.head_dim).transpose(1, 2) for p in (self.q, self.k, self.v)
        )
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o(attended.transpose(1, 2).reshape(batch, length, -1))
        return x + self.down(F.gelu(self.up(self.norm2(x))))


class GPT(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.tokens, self.positions = nn.Embedding(VOCAB, DIM), nn.Embedding(CONTEXT, DIM)
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.norm, self.lm_head = nn.LayerNorm(DIM), nn.Linear(DIM, VOCAB)

    def forward(self, tokens: Tensor) -> Tensor:
        x = self.tokens(tokens) + self.positions(torch.arange(tokens.shape[1], device=tokens.device))
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.norm(x))


def counting_sequences(count: int) -> TensorDataset:
    """Sequences that count up modulo the vocabulary, each with its own start and stride."""
    generator = torch.Generator().manual_seed(0)
    start = torch.randint(0, VOCAB, (count, 1), generator=generator)
    stride = torch.randint(1, 4, (count, 1), generator=generator)
    sequences = (start + stride * torch.arange(CONTEXT + 1)) % VOCAB
    return TensorDataset(sequences[:, :-1], sequences[:, 1:])


def loss_of(logits: Tensor, targets: Tensor) -> Tensor:
    return F.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))


class GPTModule(dt.TrainingModule):
    """The Trainer's way, as in Lightning: tensor parallelism applied in configure_model()."""

    def __init__(self, lr: float) -> None:
        super().__init__()
        self.lr = lr
        self.gpt = GPT()
        self.losses: list[float] = []

    def configure_model(self) -> None:
        from torch.distributed.tensor import DTensor
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

        tp_mesh = self.device_mesh["tensor_parallel"]
        if tp_mesh.size() == 1 or isinstance(self.gpt.blocks[0].q.weight, DTensor):
            return  # nothing to split, or already split (configure_model may run again)
        styles = {"colwise": ColwiseParallel, "rowwise": RowwiseParallel}
        parallelize_module(self.gpt, tp_mesh, {path: styles[style]() for path, style in TP_PLAN.items()})
        # The strategy then applies fully_shard over self.device_mesh["data_parallel"] (auto_wrap_policy).

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        tokens, targets = batch
        loss = loss_of(self.gpt(tokens), targets)
        self.losses.append(loss.item())
        self.log("loss", loss, prog_bar=True)
        return loss

    def configure_optimizers(self) -> Any:
        return torch.optim.AdamW(self.parameters(), lr=self.lr)


def train_with_trainer(args: argparse.Namespace) -> tuple[list[float], bool]:
    dt.seed_everything(0)
    module = GPTModule(args.lr)
    layout = ParallelLayout(dp_replicate=args.replicate, dp_shard="auto", tp=args.tp)
    trainer = dt.Trainer(
        accelerator=args.accelerator,
        devices=args.devices,
        strategy=ModelParallelStrategy(layout=layout, auto_wrap_policy={Block}),
        max_steps=args.steps,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        logger=False,
    )
    trainer.fit(module, DataLoader(counting_sequences(512), batch_size=args.batch_size))
    return module.losses, trainer.is_global_zero


def train_with_accelerator(args: argparse.Namespace) -> tuple[list[float], bool]:
    config = dt.ParallelismConfig(dp_replicate_size=args.replicate, dp_shard_size=-1, tp_size=args.tp)
    accelerator = dt.Accelerator(
        accelerator=args.accelerator,
        devices=args.devices,
        parallelism_config=config,
        tp_plan=TP_PLAN if args.tp > 1 else None,
    )
    dt.seed_everything(0)
    model = GPT()
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    loader = DataLoader(counting_sequences(512), batch_size=args.batch_size)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    losses: list[float] = []
    for tokens, targets in loader:
        loss = loss_of(model(tokens), targets)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
        if len(losses) == args.steps:
            break
    return losses, accelerator.is_main_process


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--door", choices=["trainer", "accelerator"], default="trainer")
    parser.add_argument(
        "--accelerator", default="cpu", help="'cpu' (default) or 'cuda' (one process per GPU)"
    )
    parser.add_argument("--devices", type=int, default=4, help="processes (default 4)")
    parser.add_argument("--tp", type=int, default=2, help="tensor-parallel size")
    parser.add_argument("--replicate", type=int, default=1, help="data-parallel replicas (HSDP when > 1)")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=8, help="sequences per data-parallel rank and step")
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--out", type=Path, default=None, help="write the losses (rank 0) to this JSON file")
    args = parser.parse_args()
    torch.set_num_threads(1)
    # FSDP2 warns when the sharded root returns a view (the 3-D logits of a Linear are one) that an
    # in-place op on it would skip its backward hook; this program makes none.
    warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module .* returned a view tensor")
    losses, main_process = (
        train_with_trainer(args) if args.door == "trainer" else train_with_accelerator(args)
    )
    if main_process:
        print(f"{args.door}: loss {losses[0]:.3f} -> {losses[-1]:.3f} in {len(losses)} steps")
        if args.out is not None:
            args.out.write_text(json.dumps({"door": args.door, "losses": losses}))


if __name__ == "__main__":
    main()
