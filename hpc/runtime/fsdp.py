"""Sharded data parallelism (FSDP2): parameters, gradients and optimizer state split over tasks.

    with hpc.ddp.session() as s:
        model = s.wrap(Net(), strategy="fsdp")       # hpc.runtime.fsdp.shard over s.mesh
        opt = torch.optim.AdamW(model.parameters())  # built after wrapping: it holds the shards

Each task keeps 1/world_size of every parameter (a DTensor sharded on dim 0). A sharding unit
gathers its parameters just before its forward and backward and frees them after, so peak
memory is one unit's full parameters plus the shards. Units are, by default, the elements of
every ``nn.ModuleList`` in the model (transformer blocks, as torchtitan shards them), then the
root, which takes whatever parameters the units left (embeddings, heads). A model without a
module list is one unit: correct, but it gathers all its parameters at once.

A model too large for one device is built on the ``meta`` device (no memory), sharded there, and
only then given storage: ``to_empty`` allocates each rank's shards on its device, and the shards
are initialised by the modules' own ``reset_parameters`` (one module's full tensors at a time, of
which each rank keeps its shard: seeded alike, the ranks make the model one process makes) or by
``init_fn(model)``, which writes the DTensors itself (on a CPU mesh DTensor's random ops draw every
shard from its rank's generator as if it were the whole tensor). No rank ever holds the full model.
A model built on the CPU is moved to the device one unit at a time by ``fully_shard`` itself,
so the device holds at most one unit's full parameters beside the shards.

Precision follows the session: with ``hpc.ddp.session(bf16=True)`` on CUDA the gathered
parameters are bf16 and gradients are reduced in fp32
(``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)``), while the shards and the optimizer
keep fp32. Otherwise (the default, and in a session on the CPU) everything stays in the model's
dtype. ``shard(..., bf16=True)`` itself applies the bf16 policy on any device.
"""

from __future__ import annotations

from typing import Callable, Iterable

import torch

__all__ = ["shard", "default_units", "default_policy", "on_meta", "materialize"]


def default_units(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The elements of the outermost module lists, in model order."""
    units: list[torch.nn.Module] = []
    inside: set[int] = set()  # ids of modules below a chosen unit: never a unit themselves
    for _, module in model.named_modules():
        if id(module) in inside:
            continue
        if isinstance(module, torch.nn.ModuleList):
            for block in module:
                units.append(block)
                inside.update(id(m) for m in block.modules())
    return units


def default_policy(bf16: bool = False):
    """bf16 compute with fp32 gradient reduction when asked for (the session asks on CUDA only:
    ``hpc.ddp.session(bf16=True)``); the model's own dtype otherwise."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    if bf16:
        return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    return MixedPrecisionPolicy()


def on_meta(model: torch.nn.Module) -> bool:
    """True when any parameter or buffer of `model` has no storage yet (built on ``meta``)."""
    return any(t.is_meta for t in (*model.parameters(), *model.buffers()))


def materialize(model: torch.nn.Module, device: torch.device,
                init_fn: Callable[[torch.nn.Module], None] | None = None) -> torch.nn.Module:
    """Give a meta model storage on `device` (its shards, once sharded) and initialise it.

    `init_fn(model)` when given; otherwise every module that owns parameters or buffers calls its
    own ``reset_parameters()``, in model order, on full-size tensors of that module alone, of which
    each rank keeps its shard: with the same seed on every rank the model is the one
    ``materialize`` gives unsharded (a plain build's, for modules that reset themselves when built,
    as torch.nn's do). Memory: the shards plus one module's full tensors at a time.
    """
    model.to_empty(device=device)
    if init_fn is not None:
        init_fn(model)
        return model
    owners = [(name, module) for name, module in model.named_modules()
              if any(True for _ in module.parameters(recurse=False))
              or any(True for _ in module.buffers(recurse=False))]
    missing = [f"{name or 'the model'} ({type(module).__name__})" for name, module in owners
               if not callable(getattr(module, "reset_parameters", None))]
    if missing:
        raise ValueError(
            f"a model built on meta has modules without reset_parameters(): {', '.join(missing)}; "
            "expected every module that owns parameters to initialise itself. HINT: "
            "s.wrap(model, strategy='fsdp', init_fn=my_init) with my_init(model) initialising them.")
    with torch.no_grad():
        for _, module in owners:
            _reset_whole(module)
    return model


def _reset_whole(module: torch.nn.Module) -> None:
    """module.reset_parameters() on full tensors, then each DTensor keeps its own part of them.

    Run on the shards, the init would draw each shard from its rank's generator as if it were the
    whole tensor: the same values on every rank on a CPU mesh (one block repeated), and never the
    values a plain build draws."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    slots = [(store, name, t) for store in (module._parameters, module._buffers)
             for name, t in store.items() if isinstance(t, DTensor)]
    for store, name, t in slots:
        full = torch.empty(t.shape, dtype=t.dtype, device=t.device)
        store[name] = torch.nn.Parameter(full, t.requires_grad) if isinstance(t, torch.nn.Parameter) else full
    try:
        module.reset_parameters()
        for store, name, t in slots:  # src_data_rank=None: this rank's chunk of its own draw, no collective
            mine = distribute_tensor(store[name].detach(), t.device_mesh, t.placements, src_data_rank=None)
            t.to_local().copy_(mine.to_local())
    finally:
        for store, name, t in slots:
            store[name] = t


def shard(model: torch.nn.Module, mesh, units: Iterable[torch.nn.Module] | None = None,
          mp_policy=None, bf16: bool = False) -> torch.nn.Module:
    """fully_shard each unit, then the root; returns the model (FSDP2 shards it in place).
    bf16: default_policy(bf16=True) on any device (the session passes it on CUDA only).
    A meta model stays on meta: call materialize() afterwards."""
    from torch.distributed.fsdp import fully_shard

    chosen = default_units(model) if units is None else list(units)
    if any(unit is model for unit in chosen):
        raise ValueError("units= contains the model itself; the root is sharded last anyway. "
                         "HINT: pass its blocks, e.g. units=list(model.layers)")
    policy = mp_policy if mp_policy is not None else default_policy(bf16)
    for unit in chosen:
        fully_shard(unit, mesh=mesh, mp_policy=policy)
    return fully_shard(model, mesh=mesh, mp_policy=policy)
