"""Staging copies of a checkpoint's state: reused CPU buffers, filled by several threads at once.

    staging = Staging()
    copy = staging.stage(state, cpu_too=True, pin=True)   # same structure, tensors in kept buffers

Used by the store's background writers: a thread writer needs a private copy of every tensor
(training keeps changing the live ones), a forked writer only of the accelerator tensors; and by
DCP saves (hpc.checkpoint.replicas), where a DTensor's local shard is copied and wrapped again in
the DTensor's own layout.
"""

from __future__ import annotations

import mmap
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

import torch


class Staging:
    """CPU copies of a state's tensors, in buffers kept from one save to the next.

    A fresh deep copy pays allocation and a page fault per 4 KiB on every save; copy_ into a
    buffer of the same shape and dtype (the usual case: a model's state has fixed shapes) is a
    plain memcpy. Buffers are keyed by their position in the state. With `cpu_too=False` only
    accelerator tensors are copied (the forked writer gets CPU tensors copy-on-write).

    CPU-to-CPU copies of PARALLEL_MIN_BYTES and more are cut into equal byte ranges copied by
    `threads` threads at once (torch's copy_ releases the GIL): one core does not saturate the
    memory bus, and the training loop is blocked for the whole copy. Device-to-host copies stay on
    the calling thread: they are asynchronous DMA on the current stream.

    `pin=True` pins the buffers of device tensors for full-speed copies. The forked writer asks
    for pageable buffers: drivers may mark pinned host memory MADV_DONTFORK (ROCm does; CUDA is
    not documented either way), and a child reading such pages would crash.

    `private=True`: no other process ever reads these buffers (DCP writes them from a thread of
    this one), so their pageable buffers are mapped MADV_DONTFORK. Any fork (the store's forked
    writer, a DataLoader's workers) otherwise write-protects every page of the process, these
    buffers included, and the next save's copy into them takes a fault per 4 KiB page: 2 to 3x
    the copy's time (BENCHMARKS.md section 2). A buffer of the store itself must stay visible to
    its forked writer, which reads the staged tensors.
    """

    PARALLEL_MIN_BYTES = 4 * 2**20  # below this, handing work to threads costs more than it saves

    def __init__(self, threads: int | None = None, private: bool = False) -> None:
        self.private = private and hasattr(mmap, "MADV_DONTFORK")  # Linux
        self._buffers: dict[tuple, tuple[torch.Tensor, bool]] = {}  # key -> (buffer, pinned)
        self.threads = max(1, threads if threads is not None else min(4, _usable_cpus()))
        self._pool: tuple[int, ThreadPoolExecutor] | None = None  # (pid, executor)

    def stage(self, obj: Any, cpu_too: bool, pin: bool = False,
              only: Callable[[torch.Tensor], bool] | None = None) -> Any:
        """A copy of `obj` whose tensors are in kept buffers; with `only`, the tensors it rejects
        stay the live ones (another rank writes them)."""
        device_copies: list[tuple[torch.Tensor, torch.Tensor]] = []
        host_copies: list[tuple[torch.Tensor, torch.Tensor]] = []
        out = self._plan(obj, (), cpu_too, pin, device_copies, host_copies, only)
        devices = source_devices(src for _, src in device_copies)
        # Every stream of every source device first: the state may have been written on a side
        # stream, or on a device other than the current one (a process driving several GPUs).
        synchronize(devices)
        for dst, src in device_copies:
            dst.copy_(src, non_blocking=True)
        self._copy_host(host_copies)
        synchronize(devices)  # the non_blocking copies must land before anyone reads them
        return out

    def _plan(self, obj: Any, key: tuple, cpu_too: bool, pin: bool,
              device_copies: list, host_copies: list, only: Callable | None = None) -> Any:
        """The copy of `obj` with fresh-or-reused buffers in place of its tensors; the copies
        into them are listed, not yet made."""
        if isinstance(obj, torch.Tensor):
            if only is not None and not only(obj):
                return obj
            if is_dtensor(obj):  # FSDP's shards: stage the local shard, keep the layout
                local = self._plan(obj.to_local(), key, cpu_too, pin, device_copies, host_copies)
                return type(obj)(local, obj._spec, requires_grad=False)
            on_device = obj.device.type != "cpu"
            if not (cpu_too or on_device):
                return obj
            src = obj.detach()
            dst = self._buffer(src, key, pin and on_device)
            (device_copies if on_device else host_copies).append((dst, src))
            return dst
        if isinstance(obj, dict):
            return type(obj)((k, self._plan(v, key + (k,), cpu_too, pin, device_copies, host_copies, only))
                             for k, v in obj.items())
        if isinstance(obj, (list, tuple)):
            return type(obj)(self._plan(v, key + (i,), cpu_too, pin, device_copies, host_copies, only)
                             for i, v in enumerate(obj))
        return obj

    def _buffer(self, t: torch.Tensor, key: tuple, pin: bool) -> torch.Tensor:
        # pinned-ness is remembered, not asked of the tensor: is_pinned() may call into the driver
        buf, pinned = self._buffers.get(key, (None, False))
        if buf is None or buf.shape != t.shape or buf.dtype != t.dtype or pinned != pin:
            nbytes = t.numel() * t.element_size()
            if self.private and not pin and nbytes:
                buf = _unforked(nbytes).view(t.dtype).view(t.shape)
            else:
                buf = torch.empty(t.shape, dtype=t.dtype, pin_memory=pin)
            self._buffers[key] = (buf, pin)
        return buf

    def _copy_host(self, pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        total = sum(dst.nbytes for dst, _ in pairs)
        if self.threads == 1 or total < self.PARALLEL_MIN_BYTES:
            _copy_pieces(pairs)
            return
        shares = _split(pairs, self.threads)
        if self._pool is None or self._pool[0] != os.getpid():  # threads do not survive fork
            self._pool = (os.getpid(), ThreadPoolExecutor(self.threads - 1, thread_name_prefix="checkpoint-stage"))
        futures = [self._pool[1].submit(_copy_pieces, share) for share in shares[1:]]
        _copy_pieces(shares[0])
        for f in futures:
            f.result()


def _unforked(nbytes: int) -> torch.Tensor:
    """A uint8 tensor over an anonymous mapping of its own, left out of every fork. The mapping is
    the tensor's alone (never reused by the allocator for anything a child might read), and
    torch.frombuffer keeps it alive as long as the tensor."""
    mapping = mmap.mmap(-1, nbytes)
    mapping.madvise(mmap.MADV_DONTFORK)
    return torch.frombuffer(mapping, dtype=torch.uint8, count=nbytes)


def is_dtensor(t: torch.Tensor) -> bool:
    if type(t) is torch.Tensor or not torch.distributed.is_available():
        return False
    from torch.distributed.tensor import DTensor

    return isinstance(t, DTensor)


def tensors_in(obj: Any):
    """Every tensor in a nested structure of dicts, lists and tuples."""
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from tensors_in(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from tensors_in(v)


def source_devices(tensors) -> list[torch.device]:
    """The CUDA devices the tensors live on, in index order."""
    found = {t.device for t in tensors if t.device.type == "cuda"}
    return sorted(found, key=lambda d: d.index if d.index is not None else -1)


def synchronize(devices: list[torch.device]) -> None:
    """Wait for all work on every stream of each device (the current device alone is not enough)."""
    if devices and torch.cuda.is_available():
        for device in devices:
            torch.cuda.synchronize(device)


def _usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))  # the job's allocation, not the node's core count
    except AttributeError:
        return os.cpu_count() or 1


def _copy_pieces(pieces: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
    for dst, src in pieces:
        dst.copy_(src)


def _split(pairs: list[tuple[torch.Tensor, torch.Tensor]], n: int) -> list[list]:
    """Cut the copies into `n` shares of (nearly) equal bytes. Contiguous tensors are cut into
    flat ranges; a non-contiguous one goes whole into the share where it starts."""
    total = sum(dst.nbytes for dst, _ in pairs)
    quota = max(1, -(-total // n))
    shares: list[list] = [[] for _ in range(n)]
    offset = 0  # bytes assigned so far
    for dst, src in pairs:
        if not (src.is_contiguous() and dst.is_contiguous()) or dst.dtype != src.dtype or dst.numel() == 0:
            shares[min(n - 1, offset // quota)].append((dst, src))
            offset += dst.nbytes
            continue
        flat_dst, flat_src, size = dst.view(-1), src.view(-1), dst.element_size()
        start = 0
        while start < dst.numel():
            share = min(n - 1, (offset + start * size) // quota)
            end = dst.numel() if share == n - 1 else min(dst.numel(), -(-((share + 1) * quota - offset) // size))
            shares[share].append((flat_dst[start:end], flat_src[start:end]))
            start = end
        offset += dst.nbytes
    return shares
