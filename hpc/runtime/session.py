"""What a training task can do with the other tasks of its job, once hpc.ddp.session() has joined them.

    with hpc.ddp.session() as s:   # s is a Session
        model = s.wrap(Net(), strategy="fsdp")
        loader = s.loader(data, batch_size=16)
        loss = s.all_reduce_mean(loss)

Models are replicated (DDP) or sharded (hpc.runtime.fsdp); data is split per rank with a resumable sampler;
reductions cost one collective; TensorBoard and progress bars exist on rank 0 only (NullWriter
elsewhere). Nothing here starts or ends the process group: that is hpc.ddp.session's.
"""

from __future__ import annotations

import contextlib
import datetime
from typing import Any, Iterable

import torch
import torch.distributed as dist

from hpc.runtime.batching import BatchPlan, plan_batch
from hpc.runtime.distenv import DistEnv
from hpc.runtime.sharding import round_robin


class NullWriter:
    """Stands in for SummaryWriter on ranks other than 0: every call does nothing."""

    def __getattr__(self, name):
        return lambda *args, **kwargs: None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class Session:
    """What a training task needs to know and do about the other tasks."""

    def __init__(self, env: DistEnv, device: torch.device, bf16: bool = False, timeout_s: float = 600,
                 train_timeout_s: float | None = None):
        self.env = env
        self.rank, self.local_rank, self.world_size = env.rank, env.local_rank, env.world_size
        self.device = device
        self.is_main = env.rank == 0
        self.bf16 = bf16 and device.type == "cuda"
        self._samplers: list = []
        self._wrapped: list[torch.nn.Module] = []
        self._mesh = None
        # collectives wait timeout_s during start-up, train_timeout_s once training_started()
        self.timeout_s = timeout_s  # what they wait now, on every group of the session
        self.train_timeout_s = train_timeout_s or timeout_s
        self._timeout_pending = train_timeout_s is not None
        self._groups: list = []  # groups made besides the default one: their timeouts switch with it

    @property
    def distributed(self) -> bool:
        return self.world_size > 1 and dist.is_available() and dist.is_initialized()

    # -- models and data -------------------------------------------------------------------
    def wrap(self, model: torch.nn.Module, strategy: str = "ddp", init_fn=None, **kwargs) -> torch.nn.Module:
        """Put on this task's device, then shard ("fsdp") or replicate ("ddp", the default).

        One task alone gets the plain model under either strategy: there is nothing to share.
        A model built on the meta device gets storage only here: under FSDP after sharding (each
        rank allocates and initialises its shards only), otherwise before wrapping; it is
        initialised by its modules' reset_parameters() or by `init_fn(model)` (hpc.runtime.fsdp).
        kwargs go to DistributedDataParallel, or to hpc.runtime.fsdp.shard (units=, mp_policy=).
        """
        from hpc.runtime.fsdp import materialize, on_meta  # FSDP's modules load only for a sharded model

        if strategy not in _STRATEGIES:
            raise ValueError(f"unknown strategy {strategy!r}; expected one of {sorted(_STRATEGIES)}. "
                             "HINT: s.wrap(model, strategy='fsdp') shards parameters, gradients and "
                             "optimizer state; 'ddp' keeps a full copy on every task")
        meta, sharded = on_meta(model), strategy == "fsdp" and self.distributed
        if meta and not sharded:
            model = materialize(model, self.device, init_fn)
        elif not sharded:  # fully_shard moves one unit at a time: never the whole model at once
            model = model.to(self.device)
        if not self.distributed:
            return model
        wrapped = _STRATEGIES[strategy](self, model, **kwargs)
        if meta and sharded:
            materialize(wrapped, self.device, init_fn)
        self._wrapped.append(wrapped)
        return wrapped

    @property
    def mesh(self):
        """A one-dimensional device mesh over all tasks (FSDP shards over it); built once."""
        if self._mesh is None:
            from torch.distributed.device_mesh import init_device_mesh

            self._mesh = init_device_mesh(self.device.type, (self.world_size,))
            group = self._mesh.get_group()
            if group is not dist.group.WORLD:  # torch makes one for a CUDA mesh over a gloo group
                dist.distributed_c10d._set_pg_timeout(datetime.timedelta(seconds=self.timeout_s), group)
                self._groups.append(group)
        return self._mesh

    def new_group(self, backend: str = "gloo"):
        """A process group of all tasks whose collectives wait as long as the session's do (timeout_s,
        then train_timeout_s): torch's default for a new group is 30 minutes whatever the session's.
        A collective: every rank calls it at the same point of the program."""
        group = dist.new_group(backend=backend, timeout=datetime.timedelta(seconds=self.timeout_s))
        self._groups.append(group)
        return group

    def loader(self, dataset, batch_size: int, shuffle: bool = True, seed: int = 0,
               drop_last: bool = True, **loader_kwargs) -> torch.utils.data.DataLoader:
        """DataLoader over this rank's share; set_epoch() reshuffles all of them. Its position
        is resumable state (hpc.runtime.sampler): register it with TrainLoop.resume."""
        from hpc.runtime.sampler import ResumableLoader, ResumableSampler  # torch.utils.data: only with a loader

        # drop_last keeps per-rank step counts equal: an extra step on one rank would
        # wait forever for the gradient all-reduce of the others.
        sampler = ResumableSampler(dataset, num_replicas=self.world_size, rank=self.rank,
                                   shuffle=shuffle, seed=seed, drop_last=drop_last)
        pin = self.device.type == "cuda"
        loader = ResumableLoader(dataset, sampler, batch_size=batch_size, drop_last=drop_last,
                                 pin_memory=loader_kwargs.pop("pin_memory", pin), **loader_kwargs)
        self._samplers.append(loader)  # its set_epoch also resets the position
        return loader

    def set_epoch(self, epoch: int) -> None:
        for sampler in self._samplers:
            sampler.set_epoch(epoch)

    def shard(self, n_items: int, epoch: int, seed: int = 0) -> list[int]:
        """This rank's indices of a list (LangSplat's cameras), reshuffled per epoch."""
        return round_robin(n_items, self.rank, self.world_size, epoch, seed)

    def plan_batch(self, global_batch: int, per_device_max: int) -> BatchPlan:
        return plan_batch(global_batch, per_device_max, self.world_size)

    def no_sync_if(self, cond: bool, model: torch.nn.Module | None = None):
        """Skip the gradient all-reduce (DDP) or reduce-scatter (FSDP) while accumulating."""
        models = [model] if model is not None else self._wrapped
        stack = contextlib.ExitStack()
        if cond:
            for m in models:
                if hasattr(m, "no_sync"):
                    stack.enter_context(m.no_sync())
                elif hasattr(m, "set_requires_gradient_sync"):  # an FSDP2 module
                    m.set_requires_gradient_sync(False)
                    stack.callback(m.set_requires_gradient_sync, True)
        return stack

    def autocast(self):
        """bf16 autocast on CUDA when the session asked for it; nothing otherwise."""
        if self.bf16:
            return torch.autocast("cuda", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    # -- collectives -----------------------------------------------------------------------
    def all_reduce_mean(self, value):
        """Mean over ranks; a float comes back as a float, a tensor as a new tensor."""
        return self._reduce(value, mean=True)

    def all_reduce_sum(self, value):
        return self._reduce(value, mean=False)

    def _reduce(self, value, mean: bool):
        # Called every step: one copy of the value (all_reduce works in place), one collective,
        # nothing else. A tensor stays a tensor, so nothing waits for the device here.
        if not torch.is_tensor(value):
            return self._reduce(torch.tensor(float(value), dtype=torch.float64), mean).item()
        t = value.detach()
        if not self.distributed:
            return t.clone()
        here = t.device == self.device  # nccl reduces only CUDA tensors, gloo only CPU ones
        t = t.clone() if here else t.to(self.device)
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        if mean:
            t = t.div_(self.world_size) if t.is_floating_point() else t / self.world_size
        return t if here else t.to(value.device)

    def training_started(self) -> None:
        """After the first step (TrainLoop calls it): collectives wait train_timeout_s from here on.
        A barrier first, as torchtitan does: no rank may meet the shorter timeout of a peer while
        it is still in its start-up (compiling, loading a checkpoint)."""
        if self._timeout_pending and self.distributed:
            self.barrier()
            for group in (None, *self._groups):  # None: the default group
                dist.distributed_c10d._set_pg_timeout(datetime.timedelta(seconds=self.train_timeout_s), group)
            self.timeout_s = self.train_timeout_s
        self._timeout_pending = False

    def barrier(self) -> None:
        if not self.distributed:
            return
        if self.device.type == "cuda":
            dist.barrier(device_ids=[self.device.index])
        else:
            dist.barrier()

    # -- rank 0 only -----------------------------------------------------------------------
    def writer(self, logdir, **writer_kwargs):
        """TensorBoard SummaryWriter on rank 0, a NullWriter elsewhere."""
        if not self.is_main:
            return NullWriter()
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as err:  # a container image without it: hpc cannot carry it in (hpc.container.carry)
            raise ImportError(f"TensorBoard logging on rank 0, but tensorboard does not import here ({err}); "
                              "expected it installed where the ranks run. HINT: install tensorboard in the container "
                              "image, or pass tensorboard=False to the TrainLoop") from err

        return SummaryWriter(log_dir=str(logdir), **writer_kwargs)

    def progress(self, iterable: Iterable, **tqdm_kwargs) -> Iterable:
        if not self.is_main:
            return iterable
        from tqdm import tqdm

        return tqdm(iterable, **tqdm_kwargs)


def _ddp(s: Session, model: torch.nn.Module, **ddp_kwargs) -> torch.nn.Module:
    from torch.nn.parallel import DistributedDataParallel

    ids = [s.device.index] if s.device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=ids, **ddp_kwargs)


def _fsdp(s: Session, model: torch.nn.Module, **kwargs) -> torch.nn.Module:
    from hpc.runtime.fsdp import shard

    return shard(model, s.mesh, bf16=s.bf16, **kwargs)  # the session's precision, never forced


# strategy name -> how to wrap a model that is already on this task's device
_STRATEGIES = {"ddp": _ddp, "fsdp": _fsdp}


def bitwise_ddp_kwargs() -> dict[str, Any]:
    """DDP options under which a resumed run sums gradients exactly as an uninterrupted one.

    DDP rebuilds its gradient buckets after the first iteration (in gradient-ready order), so the
    first step after a resume runs with the initial layout while the uninterrupted run is on the
    rebuilt one; gloo and NCCL add each element in an order set by its offset in the bucket, and
    the weights drift apart by ~1e-8. One parameter per bucket fixes every offset. It costs one
    all-reduce per parameter: meant for tests and small models (``s.wrap(m, **bitwise_ddp_kwargs())``).
    """
    return {"bucket_cap_mb_list": [1e-6]}  # 1 byte: every bucket closes after one tensor
