"""Raw PyTorch: the reference loop every framework is compared against.

One code path for one process and for ``torchrun`` (nanoGPT style): under torchrun it joins the
process group, wraps the model in ``DistributedDataParallel`` and shards the data with a
``DistributedSampler``.
"""

import os

import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DistributedSampler

from benchmarks.cases import common


def train(config: dict) -> tuple[nn.Module, int]:
    """Train for ``config["total_steps"]`` steps; the trained module and this process's rank.

    Under torchrun the process group is left open for the caller (rank 0 reports before it goes).
    """
    distributed = "RANK" in os.environ
    model = common.build_model(config)
    dataset = common.build_dataset(config)
    sampler = None
    train_model = model
    if distributed:
        if not dist.is_initialized():  # the DDP A/B program makes it once for all its variants
            dist.init_process_group("gloo")
        train_model = DistributedDataParallel(model)
        sampler = DistributedSampler(dataset, shuffle=False)
    optimizer = common.build_optimizer(train_model, config)
    for features, targets in common.build_loader(config, dataset, sampler):
        optimizer.zero_grad(set_to_none=True)
        loss = common.loss_fn(train_model(features), targets)
        loss.backward()
        optimizer.step()
    return model, dist.get_rank() if distributed else 0


def main() -> None:
    config = common.load_config()
    clock = common.StepClock()
    model, rank = train(config)
    common.report(config, clock, model, rank=rank)
    if dist.is_initialized():
        # Leave together: a rank that tears gloo down while rank 0 still computes the final loss
        # gets SIGABRT (seen under load), which would fail the case's reference run.
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
