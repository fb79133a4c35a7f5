"""Strategy names that are not registered but that users still meet, each with its history and replacement.

Lightning's older releases and documentation use strategy names that no longer exist there either
(``"dp"``, ``"ddp2"``, ``"ddp_sharded"``, ``"horovod"``, ``"ipu_strategy"`` …), and its docs list
third-party strategies (Colossal-AI, Bagua, hivemind) that other packages provided. Asking for one
of them is answered with what it was and what to write instead, not with a guess at the closest
registered name. A package that registers one of these names (see ``docs/extending.md``,
"Registering from a package") makes it an ordinary strategy: registered entries win.
"""

from __future__ import annotations

_FSDP = (
    "FairScale, which is no longer developed; its sharding lives on in PyTorch as FSDP. Use strategy='fsdp' "
    "(parameters, gradients and optimizer states sharded) or strategy='deepspeed_stage_2' (optimizer states "
    "and gradients only, as 'ddp_sharded' did)."
)
_IPU = (
    "Graphcore IPUs, through Graphcore's PopTorch. Lightning moved IPU support out to the "
    "lightning-graphcore package in 2.0, and PopTorch is no longer maintained, so there is no PyTorch backend "
    "for IPUs to run on. Train on another accelerator (accelerator='auto' picks what is here)."
)

RETIRED_STRATEGIES: dict[str, str] = {
    "dp": (
        "strategy='dp' (torch.nn.DataParallel: one process driving several GPUs by splitting each batch) was "
        "removed in Lightning 2.0: it is slower than one process per GPU even on one machine and cannot span "
        "nodes. Use strategy='ddp' with the same devices=."
    ),
    "ddp2": (
        "strategy='ddp2' (DataParallel inside each node, DDP across nodes) has been refused by Lightning since "
        "1.7 (broken since torch 1.9) and was removed in 1.8. Use strategy='ddp' with devices= GPUs per node "
        "and num_nodes=."
    ),
    "ddp_sharded": f"strategy='ddp_sharded' was optimizer and gradient sharding from {_FSDP}",
    "ddp_sharded_spawn": f"strategy='ddp_sharded_spawn' was optimizer and gradient sharding from {_FSDP}",
    "ddp_fully_sharded": f"strategy='ddp_fully_sharded' was fully sharded training from {_FSDP}",
    "horovod": (
        "strategy='horovod' (Horovod's ring all-reduce, with processes started by horovodrun) was removed in "
        "Lightning 2.0; PyTorch's own DDP does the same. Use strategy='ddp' and start the processes with "
        "`drivetrain launch -n N train.py` (or torchrun) instead of horovodrun."
    ),
    "ipu_strategy": f"strategy='ipu_strategy' trained on {_IPU}",
    "ipu": f"strategy='ipu' trained on {_IPU}",
    "tpu_spawn": (
        "strategy='tpu_spawn' is Lightning 1.x's name of the XLA strategy, renamed 'xla' in Lightning 2.0. "
        "Use strategy='xla' (with accelerator='tpu')."
    ),
    "single_tpu": (
        "strategy='single_tpu' is Lightning 1.x's name of the one-device XLA strategy, renamed 'single_xla' "
        "in Lightning 2.0. Use strategy='single_xla' (with accelerator='tpu', devices=1)."
    ),
}

#: Third-party strategies Lightning's documentation lists: (what it is, the package that provided it to Lightning).
THIRD_PARTY_STRATEGIES: dict[str, tuple[str, str]] = {
    "colossalai": (
        "Colossal-AI's parallel training (ZeRO, Gemini memory management)",
        "lightning-colossalai",
    ),
    "bagua": (
        "Bagua's distributed training algorithms (gradient compression, decentralised SGD)",
        "lightning-bagua",
    ),
    "hivemind": ("hivemind's decentralised training across the Internet", "lightning-hivemind"),
}


def _third_party(name: str, what: str, package: str) -> str:
    return (
        f"strategy={name!r} is {what}, a third-party strategy that the package {package} provided to Lightning; "
        f"drivetrain does not ship it, and no installed package registers it. A package provides a strategy to "
        f"drivetrain under a name through the 'drivetrain.strategies' entry-point group, in its pyproject.toml: "
        f'[project.entry-points."drivetrain.strategies"] {name} = "your_package:YourStrategy", where YourStrategy '
        f"subclasses drivetrain.strategies.Strategy and registers {name!r} in its register_strategies classmethod "
        f"(docs/extending.md, 'Registering from a package'). Once such a package is installed, strategy={name!r} "
        f"works; `drivetrain check-plugin your_package:YourStrategy` checks it."
    )


RETIRED_STRATEGY_NAMES: dict[str, str] = {
    **RETIRED_STRATEGIES,
    **{name: _third_party(name, what, package) for name, (what, package) in THIRD_PARTY_STRATEGIES.items()},
}
"""Every name above with the sentence a request for it gets (the strategy registry's ``retired=``)."""
