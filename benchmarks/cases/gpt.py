# ruff: noqa: RUF002 (tables and messages use typographic signs on purpose)
"""The GPU case's model and data: a GPT-style decoder on synthetic, learnable tokens.

Like ``common.py`` this runs in every interpreter, so it needs only torch. The config's ``size``
picks the shape: ``"gpt"`` (default) is about 110 M parameters (12 layers, width 768, 12 heads,
vocabulary 32768, context 1024, batch 16); ``"batch1"`` is the same model at batch 1 (the
launch-bound regime, where a framework's host work per step shows); ``"fp8"`` is where float8 is
meant to pay: width 4096 (32 heads), context 2048, batch 4, 2 layers (545 M parameters: every
linear layer is large enough by torchao's size guidance, and eight copies with AdamW fit one
80 GB GPU for the in-process A/B). Each has a dry-run size that trains on a CPU in seconds and
exercises the same code.

The tokens follow a noisy rule (the next token is ``(7 * previous + 3) mod V`` nine times in ten,
a random one otherwise), so the loss falls quickly from ``ln V`` and two runs that trained
differently end at visibly different losses: the fairness check has something to bite on.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

from benchmarks.cases import common

SIZES = {
    # layers, width, heads, vocabulary, context, batch
    "gpt": (12, 768, 12, 32768, 1024, 16),
    "gpt-dry": (2, 64, 4, 256, 32, 4),
    "batch1": (12, 768, 12, 32768, 1024, 1),
    "batch1-dry": (2, 64, 4, 256, 32, 1),
    "fp8": (2, 4096, 32, 32768, 2048, 4),
    # 288 wide: the MLP's up projection (out_features 1152) is the one layer large enough to
    # convert under tensorwise scaling, so the dry run converts and compiles something.
    "fp8-dry": (2, 288, 4, 512, 64, 2),
}


def size(config: dict[str, Any]) -> tuple[int, int, int, int, int, int]:
    name = config.get("size", "gpt")
    return SIZES[name + "-dry" if config.get("dry_run") else name]


class Block(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width, bias=False)
        self.proj = nn.Linear(width, width, bias=False)
        self.norm2 = nn.LayerNorm(width)
        self.up = nn.Linear(width, 4 * width, bias=False)
        self.down = nn.Linear(4 * width, width, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, width = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(width, dim=2)
        q, k, v = (t.view(batch, length, self.heads, width // self.heads).transpose(1, 2) for t in (q, k, v))
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attended.transpose(1, 2).reshape(batch, length, width))
        return x + self.down(F.gelu(self.up(self.norm2(x))))


class GPT(nn.Module):
    def __init__(self, layers: int, width: int, heads: int, vocabulary: int, context: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocabulary, width)
        self.position = nn.Embedding(context, width)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocabulary, bias=False)
        self.head.weight = self.embed.weight  # tied, as in GPT-2
        for name, parameter in self.named_parameters():
            if parameter.dim() == 2:
                std = 0.02 / math.sqrt(2 * layers) if name.endswith(("proj.weight", "down.weight")) else 0.02
                nn.init.normal_(parameter, std=std)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.embed(tokens) + self.position(positions)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def build_model(config: dict[str, Any]) -> GPT:
    """The model, initialised from ``config["seed"]`` on the device it trains on (fast for the large size)."""
    layers, width, heads, vocabulary, context, _ = size(config)
    torch.manual_seed(config["seed"])
    with device_for(config):
        return GPT(layers, width, heads, vocabulary, context)


def float8_layers(model: nn.Module) -> list[str]:
    """The linear layers drivetrain's ``precision="fp8"`` converts by default, chosen without drivetrain.

    Every ``nn.Linear`` but the first and the last, but those torchao's size guidance for
    tensorwise scaling expects no gain from (``in_features <= 4096 and out_features <= 1024``),
    and but those with a size not a multiple of 16: the raw torchao variant converts the same
    layers, so that the two differ only in the framework.
    """
    linears = [(name, m) for name, m in model.named_modules() if isinstance(m, nn.Linear) and name]
    edges = {linears[0][0], linears[-1][0]} if linears else set()
    return [
        name
        for name, m in linears
        if name not in edges
        and m.in_features % 16 == 0
        and m.out_features % 16 == 0
        and not (m.in_features <= 4096 and m.out_features <= 1024)
    ]


def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.reshape(-1))


def build_dataset(config: dict[str, Any], sequences: int | None = None) -> TensorDataset:
    """``total_steps * batch`` sequences of ``context + 1`` tokens (inputs and shifted targets)."""
    _, _, _, vocabulary, context, batch = size(config)
    count = (
        sequences if sequences is not None else config["total_steps"] * batch * config.get("world_size", 1)
    )
    generator = torch.Generator().manual_seed(config["seed"] + 1)
    tokens = torch.empty(count, context + 1, dtype=torch.long)
    tokens[:, 0] = torch.randint(vocabulary, (count,), generator=generator)
    noise = torch.rand(count, context, generator=generator) < 0.1
    random_tokens = torch.randint(vocabulary, (count, context), generator=generator)
    for position in range(context):
        rule = (7 * tokens[:, position] + 3) % vocabulary
        tokens[:, position + 1] = torch.where(noise[:, position], random_tokens[:, position], rule)
    return TensorDataset(tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous())


def build_loader(
    config: dict[str, Any], dataset: TensorDataset | None = None, sampler: Any = None
) -> DataLoader:
    dataset = build_dataset(config) if dataset is None else dataset
    return DataLoader(dataset, batch_size=size(config)[5], shuffle=False, sampler=sampler, drop_last=True)


def build_optimizer(model: nn.Module, config: dict[str, Any]) -> torch.optim.Optimizer:
    return torch.optim.AdamW(model.parameters(), lr=config.get("lr", 1e-3), weight_decay=0.0)


@torch.no_grad()
def final_loss(model: nn.Module, config: dict[str, Any], device: torch.device) -> float:
    """bf16-autocast loss of the trained weights on 8 held-out sequences (not in the training set).

    The model is put back on ``device`` first: some frameworks move it to the CPU after training,
    and CPU and GPU bf16 kernels round differently.
    """
    held_out = build_dataset({**config, "seed": config["seed"] + 100}, sequences=8)
    model = model.to(device)
    inputs, targets = (t.to(device) for t in held_out.tensors)
    with torch.autocast(device.type, dtype=torch.bfloat16):
        return float(loss_fn(model(inputs), targets))


def flops_per_token(config: dict[str, Any]) -> float:
    """Training FLOPs per token: 6 × matmul parameters + 12 × layers × width × context (attention)."""
    layers, width, _, vocabulary, context, _ = size(config)
    matmul_parameters = 12 * layers * width * width + width * vocabulary
    return 6 * matmul_parameters + 12 * layers * width * context


def parameter_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def tokens_per_step(config: dict[str, Any]) -> int:
    _, _, _, _, context, batch = size(config)
    return batch * context * config.get("world_size", 1)


def device_for(config: dict[str, Any]) -> torch.device:
    """The CPU for a dry run, else the (current) CUDA device."""
    return torch.device("cpu") if config.get("dry_run") else torch.device("cuda", torch.cuda.current_device())


def compile_backend(config: dict[str, Any]) -> str:
    # A dry run checks that compiled variants wire up, not how fast Inductor's kernels are.
    return "eager" if config.get("dry_run") else "inductor"


def start_clock(config: dict[str, Any]) -> common.StepClock:
    """A step clock that waits for the GPU at the first step and at both ends of the timed window."""
    if config.get("dry_run"):
        return common.StepClock()
    last = config["total_steps"] - 1
    return common.StepClock(torch.cuda.synchronize, sync_steps=(0, config["warmup_steps"] - 1, last))


def report(config: dict[str, Any], clock: common.StepClock, model: nn.Module, rank: int = 0) -> None:
    """The result line: the common fields plus tokens/s, FLOPs per token and GPU memory."""
    if rank != 0:
        return
    device = device_for(config)
    timing = clock.summary(config["warmup_steps"])
    extra: dict[str, Any] = {
        "final_loss": final_loss(model, config, device),
        "flops_per_token": flops_per_token(config),
        "parameters": parameter_count(model),
    }
    if "step_s" in timing:
        extra["tokens_per_s"] = tokens_per_step(config) / timing["step_s"]
    if device.type == "cuda":
        extra["gpu_max_allocated_gib"] = torch.cuda.max_memory_allocated() / 1024**3
        extra["gpu"] = torch.cuda.get_device_name()
    common.report(config, clock, None, rank=rank, **extra)
