"""The parallel layout: how a job's ranks split into data-, context- and tensor-parallel groups.

A :class:`ParallelLayout` says how many ranks each kind of parallelism spans::

    dp_replicate x dp_shard x cp x tp == world size

* ``dp_replicate``: copies of the (sharded) model, each on its own data (HSDP's outer level);
* ``dp_shard``: ranks that shard parameters, gradients and optimizer state (FSDP2) while each
  reads its own data;
* ``cp`` (context parallel): ranks that split each sequence (CUDA only: torch's context
  parallelism runs through the CUDA scaled-dot-product-attention kernels);
* ``tp`` (tensor parallel): ranks that split each layer's matrices (``parallelize_module``).

It is checked once, against the world size and the device type, and then builds one torch
``DeviceMesh``, rank-major (the ranks of one tensor-parallel group are neighbours, on one node
where possible). Without replication and context parallelism it is Lightning's 2-D mesh
``("data_parallel", "tensor_parallel")``; otherwise it has the dimensions ``("dp_replicate",
"dp_shard", "context_parallel", "tensor_parallel")`` and the flattened ``"data_parallel"``
(replicate x shard: the ranks that read different data) and ``"dp_shard_cp"`` (shard x cp: the
ranks FSDP shards over). :meth:`ParallelLayout.submesh` hands out each by name (short names
``"dp"``, ``"tp"``, ``"cp"`` too), keeping the flattened ones itself as torch asks.

:class:`ParallelismConfig` is the same thing under Accelerate's name and field names
(``dp_replicate_size``, ``dp_shard_size``, ``tp_size``, ``cp_size``).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

#: The mesh dimensions, outermost first.
DIMENSIONS = ("dp_replicate", "dp_shard", "context_parallel", "tensor_parallel")
#: Every name :meth:`ParallelLayout.submesh` answers to.
SUBMESH_NAMES = (*DIMENSIONS, "data_parallel", "dp_shard_cp")
ALIASES = {"dp": "data_parallel", "tp": "tensor_parallel", "cp": "context_parallel"}
AUTO = "auto"


class ParallelLayout:
    """Sizes of the data-parallel (replicate x shard), context-parallel and tensor-parallel groups.

    Args:
        dp_replicate: copies of the model, each sharded over ``dp_shard`` ranks (HSDP when > 1).
        dp_shard: ranks that shard parameters, gradients and optimizer states (FSDP2).
        tp: ranks of one tensor-parallel group.
        cp: ranks of one context-parallel group (CUDA only).

    One size may be ``"auto"`` (or ``-1``): it becomes whatever makes the product equal the
    world size. By default ``dp_shard`` is that one.

    Example:
        >>> layout = ParallelLayout(tp=2).resolve(world_size=8)
        >>> layout.dp_shard, layout.data_parallel_size, layout.data_parallel_rank(5)
        (4, 4, 2)

    Raises:
        TypeError/ValueError: a size that is not a positive int, ``"auto"`` or ``-1``, or two
            sizes left to infer.
    """

    def __init__(
        self, *, dp_replicate: int | str = 1, dp_shard: int | str = AUTO, tp: int | str = 1, cp: int | str = 1
    ) -> None:
        sizes = {"dp_replicate": dp_replicate, "dp_shard": dp_shard, "tp": tp, "cp": cp}
        for name, value in sizes.items():
            sizes[name] = _check_size(name, value)
        inferred = [name for name, value in sizes.items() if value == AUTO]
        if len(inferred) > 1:
            raise ValueError(
                f"ParallelLayout can infer one size from the world size, but {' and '.join(inferred)} are both "
                f"'auto'/-1. Give all but one of them as numbers, e.g. "
                f"ParallelLayout({inferred[0]}=2, {inferred[1]}='auto')."
            )
        self.dp_replicate: int | str = sizes["dp_replicate"]
        self.dp_shard: int | str = sizes["dp_shard"]
        self.tp: int | str = sizes["tp"]
        self.cp: int | str = sizes["cp"]
        self._mesh: Any = None
        self._named: dict[str, Any] = {}

    # -- sizes ---------------------------------------------------------------------------------
    @property
    def is_resolved(self) -> bool:
        """Whether every size is a number (after :meth:`resolve`)."""
        return AUTO not in (self.dp_replicate, self.dp_shard, self.tp, self.cp)

    def _sizes(self) -> tuple[int, int, int, int]:
        if not self.is_resolved:
            raise RuntimeError(f"{self!r} has a size left to infer; call resolve(world_size) first.")
        return int(self.dp_replicate), int(self.dp_shard), int(self.cp), int(self.tp)

    @property
    def world_size(self) -> int:
        r, s, c, t = self._sizes()
        return r * s * c * t

    @property
    def data_parallel_size(self) -> int:
        """Ranks that read different data: ``dp_replicate x dp_shard``."""
        r, s, _, _ = self._sizes()
        return r * s

    def resolve(self, world_size: int) -> ParallelLayout:
        """This layout with the ``"auto"`` size filled in for ``world_size`` ranks, checked.

        Raises:
            ValueError: the sizes cannot multiply to ``world_size``; the message names a fix.
        """
        if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
            raise ValueError(f"world_size must be a positive int, got {world_size!r}.")
        sizes = {"dp_replicate": self.dp_replicate, "dp_shard": self.dp_shard, "tp": self.tp, "cp": self.cp}
        known = 1
        for value in sizes.values():
            if value != AUTO:
                known *= int(value)
        inferred = [name for name, value in sizes.items() if value == AUTO]
        if inferred:
            if world_size % known:
                given = " x ".join(f"{k}={v}" for k, v in sizes.items() if v != AUTO and v != 1) or "1"
                raise ValueError(
                    f"The parallel layout cannot fill {inferred[0]}='auto' for {world_size} processes: the other "
                    f"sizes ({given} = {known}) do not divide {world_size}. Use sizes whose product divides the "
                    f"number of processes, or start a multiple of {known} processes."
                )
            sizes[inferred[0]] = world_size // known
        elif known != world_size:
            product = " x ".join(f"{k}={v}" for k, v in sizes.items())
            hint = ""
            others = known // int(sizes["dp_shard"])
            if world_size % others == 0:
                hint = f" (here dp_shard={world_size // others})"
            raise ValueError(
                f"The parallel layout {product} = {known} processes, but the job has {world_size}. Make the sizes "
                f"multiply to {world_size}{hint}, or set one of them to 'auto' (-1) to infer it, or start "
                f"{known} processes (devices=/num_nodes=, or your launcher's process count)."
            )
        return ParallelLayout(
            dp_replicate=int(sizes["dp_replicate"]),
            dp_shard=int(sizes["dp_shard"]),
            tp=int(sizes["tp"]),
            cp=int(sizes["cp"]),
        )

    def check_device(self, device_type: str) -> None:
        """Raise ``ValueError`` if the layout cannot run on ``device_type`` devices.

        Context parallelism splits attention over ranks through torch's CUDA SDPA kernels (flash
        or memory-efficient attention with ring exchanges); there is no CPU/gloo implementation.
        """
        if self.cp != 1 and device_type != "cuda":
            raise ValueError(
                f"cp={self.cp} (context parallel) needs CUDA GPUs: torch's context parallelism runs attention "
                f"through the CUDA scaled-dot-product-attention kernels (flash / memory-efficient) over NCCL, which "
                f"{device_type!r} devices do not have. Use cp=1 (cp_size=1) on {device_type!r}, or run on CUDA "
                f"devices (accelerator='cuda')."
            )

    # -- where a rank stands -------------------------------------------------------------------
    def coordinates(self, rank: int) -> dict[str, int]:
        """The position of global ``rank`` along each dimension of the mesh (rank-major order)."""
        r, s, c, t = self._sizes()
        if not 0 <= rank < r * s * c * t:
            raise ValueError(f"rank {rank} is outside this layout's {r * s * c * t} ranks.")
        return {
            "dp_replicate": rank // (s * c * t),
            "dp_shard": rank // (c * t) % s,
            "context_parallel": rank // t % c,
            "tensor_parallel": rank % t,
        }

    def data_parallel_rank(self, rank: int) -> int:
        """Which share of the data global ``rank`` reads (``0 .. data_parallel_size - 1``).

        Ranks of one tensor- or context-parallel group read the same share.
        """
        where = self.coordinates(rank)
        return where["dp_replicate"] * int(self.dp_shard) + where["dp_shard"]

    # -- the device mesh -----------------------------------------------------------------------
    def build_mesh(self, device_type: str) -> Any:
        """Build (once) the torch ``DeviceMesh`` of this layout; every rank must call it.

        Needs the default process group (the strategy's ``setup_environment`` makes it).
        """
        if self._mesh is not None:
            return self._mesh
        import torch.distributed as dist
        from torch.distributed.device_mesh import init_device_mesh

        r, s, c, t = self._sizes()
        if not dist.is_initialized() or dist.get_world_size() != r * s * c * t:
            have = dist.get_world_size() if dist.is_initialized() else "no process group"
            raise RuntimeError(
                f"The device mesh of {self!r} needs a process group of {r * s * c * t} ranks ({have}). Build it "
                f"after the strategy's setup_environment()."
            )
        self.check_device(device_type)
        named: dict[str, Any]
        if r == 1 and c == 1:
            # Lightning's mesh: two dimensions, nothing flattened (torch deprecates slicing a
            # flattened dimension from the root mesh, so self.device_mesh["data_parallel"] must be real).
            mesh = init_device_mesh(device_type, (s, t), mesh_dim_names=("data_parallel", "tensor_parallel"))
            data = mesh["data_parallel"]
            named = {
                "data_parallel": data,
                "dp_shard": data,
                "dp_shard_cp": data,
                "tensor_parallel": mesh["tensor_parallel"],
            }
        else:
            mesh = init_device_mesh(device_type, (r, s, c, t), mesh_dim_names=DIMENSIONS)
            named = {name: mesh[name] for name in DIMENSIONS}
            # Flattened meshes are kept here, as torch asks ("bookkeep the flattened mesh directly").
            named["data_parallel"] = mesh["dp_replicate", "dp_shard"]._flatten("data_parallel")
            named["dp_shard_cp"] = (
                mesh["dp_shard", "context_parallel"]._flatten("dp_shard_cp") if c > 1 else named["dp_shard"]
            )
        self._named = named
        self._mesh = mesh
        return mesh

    @property
    def mesh(self) -> Any:
        """The device mesh, once :meth:`build_mesh` made it."""
        if self._mesh is None:
            raise RuntimeError(
                "The device mesh is not built yet: it is made when the strategy sets up its processes "
                "(Trainer.fit / Accelerator(...)), before configure_model() runs."
            )
        return self._mesh

    def submesh(self, name: str) -> Any:
        """The 1-D sub-mesh ``name`` of this rank: one of :data:`SUBMESH_NAMES` or ``"dp"``/``"tp"``/``"cp"``.

        Raises:
            ValueError: an unknown name (the message lists the known ones).
        """
        canonical = ALIASES.get(name, name)
        if canonical not in SUBMESH_NAMES:
            raise ValueError(
                f"The parallel layout has no sub-mesh {name!r}; use one of {', '.join(map(repr, SUBMESH_NAMES))} "
                f"(or 'dp', 'tp', 'cp')."
            )
        _ = self.mesh  # raises if not built yet
        if canonical not in self._named:
            raise ValueError(
                f"This layout's mesh has no {canonical!r} dimension: with dp_replicate=1 and cp=1 it has Lightning's "
                f"two, 'data_parallel' x 'tensor_parallel' (also reachable as 'dp_shard'). Ask for one of those."
            )
        return self._named[canonical]

    def fsdp_mesh(self) -> Any:
        """The mesh ``fully_shard`` shards over: ``dp_shard x cp`` ranks, 2-D with ``dp_replicate`` (HSDP)."""
        mesh = self.mesh
        if int(self.dp_replicate) == 1:
            return self._named["dp_shard_cp"]
        return mesh["dp_replicate", "dp_shard_cp" if int(self.cp) > 1 else "dp_shard"]

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ParallelLayout):
            return NotImplemented
        return (self.dp_replicate, self.dp_shard, self.tp, self.cp) == (
            other.dp_replicate,
            other.dp_shard,
            other.tp,
            other.cp,
        )

    def __hash__(self) -> int:
        return hash((self.dp_replicate, self.dp_shard, self.tp, self.cp))

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_mesh"] = None  # process groups do not cross processes
        state["_named"] = {}
        return state

    def __repr__(self) -> str:
        return (
            f"ParallelLayout(dp_replicate={self.dp_replicate!r}, dp_shard={self.dp_shard!r}, tp={self.tp!r}, "
            f"cp={self.cp!r})"
        )


@dataclass
class TorchTensorParallelConfig:
    """Accelerate's tensor-parallel settings for ``ParallelismConfig(tp_handler=...)``.

    Args:
        enable_async_tp: asynchronous tensor parallelism; not supported (a warning, as in Accelerate).
    """

    enable_async_tp: bool = False

    def __post_init__(self) -> None:
        if self.enable_async_tp:
            warnings.warn(
                "TorchTensorParallelConfig(enable_async_tp=True): asynchronous tensor parallelism is not supported; "
                "the layers run synchronously.",
                UserWarning,
                stacklevel=3,
            )


@dataclass
class TorchContextParallelConfig:
    """Accelerate's context-parallel settings for ``ParallelismConfig(cp_handler=...)``.

    Args:
        cp_comm_strategy: how the ranks exchange keys and values: ``"allgather"`` (the default, torch's);
            ``"alltoall"`` is not supported.

    Raises:
        ValueError: another strategy.
    """

    cp_comm_strategy: str | None = None

    def __post_init__(self) -> None:
        if self.cp_comm_strategy is None:
            self.cp_comm_strategy = "allgather"
        if self.cp_comm_strategy not in ("allgather", "alltoall"):
            raise ValueError(
                f"Invalid cp_comm_strategy: {self.cp_comm_strategy}. Use 'allgather' (or 'alltoall', which "
                f"drivetrain does not support)."
            )
        if self.cp_comm_strategy == "alltoall":
            raise ValueError(
                "TorchContextParallelConfig(cp_comm_strategy='alltoall') is not supported: drivetrain's context "
                "parallelism exchanges keys and values with torch's default all-gather. Use 'allgather'."
            )


@dataclass
class ParallelismConfig:
    """Accelerate's ``ParallelismConfig``: the parallel layout under Accelerate's field names.

    Pass it as ``Accelerator(parallelism_config=ParallelismConfig(dp_shard_size=2, tp_size=2))``.
    Sizes left out are 1, as in Accelerate; one of them may be ``-1`` to infer it from the number
    of processes. The product must equal the number of processes.

    Args:
        dp_replicate_size: copies of the sharded model (HSDP when > 1).
        dp_shard_size: ranks that shard the model (FSDP2).
        tp_size: ranks of one tensor-parallel group (give the Accelerator a ``tp_plan``).
        cp_size: ranks of one context-parallel group (CUDA only).
        cp_backend: ``"torch"`` (the only one).
        sp_size: sequence parallelism (DeepSpeed's); only 1 (none) is supported.
        sp_backend: ``"deepspeed"``, for ``sp_size``.
        tp_handler: a :class:`TorchTensorParallelConfig`.
        cp_handler: a :class:`TorchContextParallelConfig`.
        sp_handler: must stay ``None`` (no sequence parallelism).

    Raises:
        TypeError, ValueError: a size that is not one, or a setting drivetrain does not support.
    """

    dp_replicate_size: int | None = None
    dp_shard_size: int | None = None
    tp_size: int | None = None
    cp_size: int | None = None
    cp_backend: str | None = None
    sp_size: int | None = None
    sp_backend: str | None = None
    tp_handler: TorchTensorParallelConfig | None = None
    cp_handler: TorchContextParallelConfig | None = None
    sp_handler: Any = None

    def __post_init__(self) -> None:
        self.to_layout()  # checks the values now, at construction
        if self.cp_backend is None:
            self.cp_backend = "torch"
        if self.sp_backend is None:
            self.sp_backend = "deepspeed"
        if self.cp_backend != "torch":
            raise ValueError(
                f"ParallelismConfig(cp_backend={self.cp_backend!r}) is not supported; use 'torch'."
            )
        if self.sp_size not in (None, 1) or self.sp_handler is not None:
            raise ValueError(
                f"ParallelismConfig(sp_size={self.sp_size!r}, sp_handler={self.sp_handler!r}): sequence parallelism "
                f"(DeepSpeed's ALST/Ulysses) is not supported. Split sequences with cp_size= (context parallelism) "
                f"instead, or leave sp_size out."
            )
        for name, value, kind in (
            ("tp_handler", self.tp_handler, TorchTensorParallelConfig),
            ("cp_handler", self.cp_handler, TorchContextParallelConfig),
        ):
            if value is not None and not isinstance(value, kind):
                raise TypeError(
                    f"ParallelismConfig({name}=...) takes a {kind.__name__}, got {type(value).__name__}."
                )
        if self.tp_enabled and self.tp_handler is None:
            self.tp_handler = TorchTensorParallelConfig()
        if self.cp_enabled and self.cp_handler is None:
            self.cp_handler = TorchContextParallelConfig()
        self.device_mesh: Any = None
        self.flattened_meshes: dict[str, Any] = {}

    def to_layout(self) -> ParallelLayout:
        """The :class:`ParallelLayout` with these sizes (``None`` -> 1, ``-1`` -> inferred)."""
        sizes = {}
        for field, name in (
            ("dp_replicate_size", "dp_replicate"),
            ("dp_shard_size", "dp_shard"),
            ("tp_size", "tp"),
            ("cp_size", "cp"),
        ):
            value = getattr(self, field)
            try:
                sizes[name] = _check_size(field, 1 if value is None else value)
            except (TypeError, ValueError) as error:
                raise type(error)(f"ParallelismConfig: {error}") from None
        return ParallelLayout(**sizes)

    def _size(self, name: str) -> int:
        value = getattr(self, f"{name}_size")
        return 1 if value is None else int(value)

    @property
    def total_size(self) -> int:
        """The number of processes the sizes multiply to (a ``-1`` size counts as 1 until resolved)."""
        total = 1
        for value in (self.dp_replicate_size, self.dp_shard_size, self.tp_size, self.cp_size):
            total *= 1 if value in (None, -1) else int(value)
        return total

    @property
    def data_parallel_size(self) -> int:
        """``dp_replicate_size x dp_shard_size``: the ranks that read different data."""
        return abs(self._size("dp_replicate") * self._size("dp_shard"))

    @property
    def non_data_parallel_size(self) -> int:
        """``tp_size x cp_size``: the ranks that read the same data."""
        return abs(self._size("tp") * self._size("cp"))

    @property
    def dp_replicate_enabled(self) -> bool:
        return self._size("dp_replicate") != 1

    @property
    def dp_shard_enabled(self) -> bool:
        return self._size("dp_shard") != 1

    @property
    def fsdp_enabled(self) -> bool:
        """Whether the model is sharded (over ``dp_shard`` or ``cp`` ranks)."""
        return self.dp_shard_enabled or self.cp_enabled

    @property
    def tp_enabled(self) -> bool:
        return self._size("tp") != 1

    @property
    def cp_enabled(self) -> bool:
        return self._size("cp") != 1

    @property
    def sp_enabled(self) -> bool:
        return False

    @property
    def dp_dim_names(self) -> list[str]:
        """The enabled mesh dimensions whose ranks read different data."""
        return [name for name in ("dp_replicate", "dp_shard") if getattr(self, f"{name}_enabled")]

    @property
    def non_dp_dim_names(self) -> list[str]:
        """The enabled mesh dimensions whose ranks read the same data."""
        return [name for name in ("tp", "cp") if getattr(self, f"{name}_enabled")]

    @property
    def dp_shard_cp_dim_names(self) -> list[str]:
        """The enabled dimensions FSDP shards the model over (flattened as ``"dp_shard_cp"``)."""
        return [name for name in ("dp_shard", "cp") if getattr(self, f"{name}_enabled")]

    @property
    def dp_cp_dim_names(self) -> list[str]:
        """The enabled dimensions the loss is averaged over (flattened as ``"dp_cp"``)."""
        return [name for name in ("dp_replicate", "dp_shard", "cp") if getattr(self, f"{name}_enabled")]

    @property
    def fsdp_dim_names(self) -> list[str]:
        """The dimensions FSDP runs over: ``dp_replicate`` when enabled, and ``dp_shard_cp``."""
        return [*(["dp_replicate"] if self.dp_replicate_enabled else []), "dp_shard_cp"]

    @property
    def active_mesh_dims(self) -> list[str]:
        return self.dp_dim_names + self.non_dp_dim_names

    def _get_mesh(self) -> tuple[tuple[str, ...], tuple[int, ...]]:
        """``(dimension names, sizes)`` of the mesh: the enabled dimensions, outermost first (Accelerate's order)."""
        order = [name for name in ("dp_replicate", "dp_shard", "cp", "tp") if name in self.active_mesh_dims]
        return tuple(order), tuple(self._size(name) for name in order)

    def build_device_mesh(self, device_type: str) -> Any:
        """The torch ``DeviceMesh`` of these sizes over the job's processes, as Accelerate builds it.

        Its dimensions are the enabled ones of ``("dp_replicate", "dp_shard", "cp", "tp")``, with the
        flattened ``"dp"`` (the data-parallel ranks), ``"dp_shard_cp"`` (what FSDP shards over) and
        ``"dp_cp"`` (what the loss is averaged over) registered on it (and kept in
        ``flattened_meshes``). ``None`` when every size is 1.
        A ``-1`` size is inferred from the process group. ``Accelerator(parallelism_config=...)``
        builds its own (``accelerator.torch_device_mesh``); this is for code that builds one itself.

        Args:
            device_type: ``"cuda"``, ``"cpu"`` …

        Raises:
            RuntimeError: the process group does not hold as many processes as the sizes multiply to.
            ValueError: context parallelism on a device type other than CUDA.
        """
        import torch.distributed as dist
        from torch.distributed.device_mesh import init_device_mesh

        world = dist.get_world_size() if dist.is_initialized() else None
        layout = self.to_layout()
        if not layout.is_resolved:
            if world is None:
                raise RuntimeError(
                    f"{self!r} has a size of -1 to infer from the number of processes, but no process group exists. "
                    f"Create the Accelerator (or the process group) first, or give every size."
                )
            layout = layout.resolve(world)
        layout.check_device(device_type)
        resolved = {
            "dp_replicate": int(layout.dp_replicate),
            "dp_shard": int(layout.dp_shard),
            "tp": int(layout.tp),
            "cp": int(layout.cp),
        }
        order = [name for name in ("dp_replicate", "dp_shard", "cp", "tp") if resolved[name] > 1]
        if not order:
            return None
        shape = tuple(resolved[name] for name in order)
        total = layout.world_size
        if world is not None and world != total:
            raise RuntimeError(
                f"ParallelismConfig sizes {dict(zip(order, shape, strict=True))} make {total} processes, but the process "
                f"group has {world}. Make the sizes multiply to {world}."
            )
        mesh = init_device_mesh(device_type, shape, mesh_dim_names=tuple(order))
        flattened = {}
        for names, flat in (
            ([n for n in ("dp_replicate", "dp_shard") if n in order], "dp"),
            ([n for n in ("dp_shard", "cp") if n in order], "dp_shard_cp"),
            ([n for n in ("dp_replicate", "dp_shard", "cp") if n in order], "dp_cp"),
        ):
            if names:
                flattened[flat] = mesh[tuple(names)]._flatten(flat)
        self.device_mesh = mesh
        #: The flattened meshes by name, kept as torch asks (slicing them from the root mesh is deprecated).
        self.flattened_meshes = flattened
        return mesh

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["device_mesh"] = None  # process groups do not cross processes
        state["flattened_meshes"] = {}
        return state

    def get_device_mesh(self, device_type: str | None = None) -> Any:
        """The mesh :meth:`build_device_mesh` built (building it for ``device_type`` the first time).

        Raises:
            ValueError: no mesh yet and no ``device_type``, or one built for another device type.
        """
        if self.device_mesh is None:
            if device_type is None:
                raise ValueError(
                    "No device mesh is built yet: pass device_type= ('cuda', 'cpu' …) to build it."
                )
            return self.build_device_mesh(device_type)
        if device_type is not None and self.device_mesh.device_type != device_type:
            raise ValueError(
                f"The device mesh was built for {self.device_mesh.device_type!r} devices, not {device_type!r}."
            )
        return self.device_mesh


def _check_size(name: str, value: Any) -> int | str:
    if value == AUTO or (isinstance(value, int) and not isinstance(value, bool) and value == -1):
        return AUTO
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(
            f"{name}= expects a positive int, 'auto' or -1, got {type(value).__name__} ({value!r})."
        )
    if value < 1:
        raise ValueError(
            f"{name}={value} is not a group size: use a positive int (1 turns that parallelism off), or "
            f"'auto'/-1 to infer it from the number of processes."
        )
    return value
