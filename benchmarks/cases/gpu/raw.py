"""Raw PyTorch GPT training: autocast bf16, optional ``torch.compile``; DDP or FSDP2 under torchrun.

Under ``torchrun`` the config's ``parallel`` picks ``DistributedDataParallel`` or FSDP2
(``fully_shard`` per block, then the root), both with the same autocast recipe as the
single-device loop, so the three differ only in the wrapper.
"""

import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DistributedSampler

from benchmarks.cases import common, gpt


def main() -> None:
    config = common.load_config()
    distributed = "RANK" in os.environ
    if distributed and not config.get("dry_run"):
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    device = gpt.device_for(config)
    clock = gpt.start_clock(config)
    model = gpt.build_model(config).to(device)
    if config.get("compile"):
        model.compile(backend=gpt.compile_backend(config))
    dataset = gpt.build_dataset(config)
    sampler = None
    train_model = model
    if distributed:
        dist.init_process_group("gloo" if device.type == "cpu" else "nccl")
        sampler = DistributedSampler(dataset, shuffle=False)
        if config["parallel"] == "fsdp":
            from torch.distributed.fsdp import fully_shard

            for block in model.blocks:
                fully_shard(block)
            fully_shard(model)
        else:
            train_model = DistributedDataParallel(
                model, device_ids=None if device.type == "cpu" else [device]
            )
    optimizer = gpt.build_optimizer(train_model, config)
    for inputs, targets in gpt.build_loader(config, dataset, sampler):
        inputs = inputs.to(device, non_blocking=True)
        targets = targets.to(device, non_blocking=True)
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss = gpt.loss_fn(train_model(inputs), targets)
        loss.backward()
        optimizer.step()
    gpt.report(config, clock, model, rank=dist.get_rank() if distributed else 0)
    if distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
