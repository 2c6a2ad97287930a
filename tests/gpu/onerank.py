"""What the GPU suite and the GPU benchmarks share: a one-rank process group on one device, and a
Session that uses it.

    with one_rank_group("cuda") as (device, backend):      # NCCL on cuda:0, gloo on "cpu"
        s = OneRankSession(device, bf16=True)              # hpc's Session, distributed at world size 1
        model = s.wrap(net, strategy="fsdp")

hpc.ddp.session() makes no process group for a single task (there is nothing to share), and a
Session counts as distributed only at world size 2 and more. NCCL refuses two ranks on one GPU, so
on a one-GPU machine the NCCL paths of a Session (DDP with device_ids, FSDP on a CUDA mesh, NCCL
reductions, barriers and object broadcasts) can only run through a group of one rank: this
Session counts as distributed whenever a group exists. Everything else is hpc's own code.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import tempfile
from typing import Iterator

import torch
import torch.distributed as dist

from hpc.runtime.envparse import from_environ
from hpc.runtime.session import Session

NO_CUDA = "no CUDA device here (torch.cuda.is_available() is False): the GPU suite needs one GPU"
NO_TWO_GPUS = "needs two GPUs (NCCL refuses two ranks on one GPU)"


def cuda_ready() -> bool:
    return torch.cuda.is_available() and torch.cuda.device_count() > 0


def device_of(kind: str) -> torch.device:
    """cuda:0 for "cuda" (the device one task bound to a single GPU gets), the CPU otherwise."""
    return torch.device("cuda", 0) if kind == "cuda" else torch.device("cpu")


@contextlib.contextmanager
def one_rank_group(kind: str, timeout_s: float = 120) -> Iterator[tuple[torch.device, str]]:
    """A default process group of one rank (NCCL on cuda:0, gloo on the CPU) over a FileStore:
    no port to find, nothing left behind."""
    device = device_of(kind)
    backend = "nccl" if device.type == "cuda" else "gloo"
    if device.type == "cuda":
        torch.cuda.set_device(device)  # before the group, as hpc.ddp.session does
    with tempfile.TemporaryDirectory(prefix="hpc-onerank-") as tmp:
        store = dist.FileStore(os.path.join(tmp, "store"), 1)
        dist.init_process_group(backend, store=store, rank=0, world_size=1,
                                timeout=datetime.timedelta(seconds=timeout_s))
        try:
            yield device, backend
        finally:
            dist.destroy_process_group()


class OneRankSession(Session):
    """hpc's Session on a one-rank group (see the module docstring): distributed while one exists."""

    def __init__(self, device: torch.device, **kwargs) -> None:
        super().__init__(from_environ({}), device, **kwargs)

    @property
    def distributed(self) -> bool:
        return dist.is_available() and dist.is_initialized()
