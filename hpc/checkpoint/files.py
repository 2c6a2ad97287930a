"""Checkpoint files: torch.save streamed to disk with a running checksum, weights-only memory-mapped loads.

    info = write_atomic(Path("step-5/shared.pt"), state)   # {"crc32": "1a2b3c4d", "bytes": 123}
    state = load_file(Path("step-5/shared.pt"))            # weights_only, mapped (local disk only)

A file is checked against its info before it is loaded (hpc.checkpoint.checksums).

Writing is one pass over the bytes: torch.save writes each tensor's storage straight from memory
into the file object (a memoryview, no copy) and the wrapper updates the checksum on the way (for
blocking saves on a second thread, at the same time as the write).

Checksum: crc32 (zlib), not sha256. It guards against torn and corrupted files, not against an
adversary (weights_only loading is what keeps a hostile file from running code), and it runs
several times faster than sha256, so it stays well ahead of the disk instead of adding to the time
of a blocking save (BENCHMARKS.md, checkpoint stall). The byte count catches truncation.
"""

from __future__ import annotations

import contextlib
import errno
import os
import pickle
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Iterator

import torch

from hpc.fs.atomic import replacing
from hpc.fs.sharedfs import mmap_ok


class ChecksumWriter:
    """File-object wrapper for torch.save: forwards write() and keeps a running crc32 and size.

    With `overlap=True`, the checksum of a large write runs on a helper thread while this thread
    writes the same bytes to the file (zlib and file writes both release the GIL): a blocking save
    then costs the longer of the two passes instead of their sum. Each write() returns only when
    both are done: torch.save may reuse or free the buffer it passed (zip headers, the CPU copy
    of an accelerator tensor) as soon as write() returns.
    """

    OVERLAP_MIN = 2**20  # smaller writes (pickled structure, zip headers): checksummed in line

    def __init__(self, raw: Any, overlap: bool = False) -> None:
        self.raw, self.crc, self.size = raw, 0, 0
        self.overlap = overlap
        # torch.save turns a failed write into "unexpected pos": the real error is kept here.
        self.error: OSError | None = None

    def write(self, data: Any) -> int:
        view = memoryview(data)
        self.size += view.nbytes
        if not self.overlap or view.nbytes < self.OVERLAP_MIN:
            self.crc = zlib.crc32(view, self.crc)
            return self._write(view)
        pending = _crc_pool().submit(zlib.crc32, view, self.crc)
        try:
            written = self._write(view)
        finally:
            self.crc = pending.result()  # also on a failed write: the buffer must not be freed early
        return written

    def _write(self, view: memoryview) -> int:
        try:
            return self.raw.write(view)
        except OSError as err:
            self.error = err
            raise

    def flush(self) -> None:
        self.raw.flush()

    def info(self) -> dict[str, Any]:
        return {"crc32": f"{self.crc:08x}", "bytes": self.size}


_crc_executor: tuple[int, ThreadPoolExecutor] | None = None  # (pid, executor)


def _crc_pool() -> ThreadPoolExecutor:
    """The checksum thread; a new one in a forked child (threads do not survive fork)."""
    global _crc_executor
    if _crc_executor is None or _crc_executor[0] != os.getpid():
        _crc_executor = (os.getpid(), ThreadPoolExecutor(1, thread_name_prefix="checkpoint-crc"))
    return _crc_executor[1]


@contextlib.contextmanager
def _no_record_crc() -> Iterator[None]:
    # torch.save also computes a crc32 per zip record (miniz): a second pass over the same bytes,
    # redundant with ours. The option is process-wide, so it is put back afterwards.
    before = torch.serialization.get_crc32_options()
    torch.serialization.set_crc32_options(False)
    try:
        yield
    finally:
        torch.serialization.set_crc32_options(before)


def write_atomic(path: Path, obj: Any, overlap: bool = False) -> dict[str, Any]:
    """torch.save `obj` to `path` via hpc.fs.atomic (``NAME.part``, fsync, rename); return its
    checksum info. `overlap`: checksum on a helper thread alongside the writes (for saves the
    caller waits on; a forked writer stays single-threaded)."""
    out = None
    try:
        with replacing(path, unique=False, sync_dir=False) as f, _no_record_crc():
            out = ChecksumWriter(f, overlap)
            torch.save(obj, out)
    except BaseException as err:
        if out is not None and out.error is not None and err is not out.error:
            raise out.error from err  # the disk's own error, not torch's "unexpected pos"
        raise
    return out.info()


_NO_SPACE = {errno.ENOSPC: "no space left on device", errno.EDQUOT: "disk quota exceeded"}


def space_error(err: BaseException, directory: Path, needed: int) -> OSError | None:
    """An OSError saying "no space left", with the bytes needed and free, when `err` (or what
    caused it) is a full disk or an exhausted quota; None for any other error."""
    while err is not None and not (isinstance(err, OSError) and err.errno in _NO_SPACE):
        err = err.__cause__ or err.__context__
    if err is None:
        return None
    try:
        st = os.statvfs(directory)
        free = f"{st.f_bavail * st.f_frsize:,} bytes free"
    except OSError:
        free = "free space unknown"
    return OSError(err.errno, f"{_NO_SPACE[err.errno]} for a checkpoint in {directory}: about "
                   f"{needed:,} bytes needed, {free} (after removing the partial write). HINT: free "
                   "space there or lower keep; the previous checkpoint is intact, and the next save "
                   "works once there is room")


def nbytes(obj: Any, cpu_only: bool = False) -> int:
    """Bytes of the tensors in `obj` (a checkpoint's size, less its small pickled structure);
    `cpu_only`: of its CPU tensors only."""
    if isinstance(obj, torch.Tensor):
        return 0 if cpu_only and obj.device.type != "cpu" else obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(nbytes(v, cpu_only) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(nbytes(v, cpu_only) for v in obj)
    return 0


def load_file(path: Path, map_location: Any = "cpu") -> Any:
    """weights_only torch.load, memory-mapped on a local disk: tensors are backed by the page cache
    (which the verification pass just filled) instead of a second copy in memory. On a network
    filesystem it reads into memory: there a page fault after another node pruned the file would be
    SIGBUS, a crash (hpc.fs.sharedfs)."""
    try:
        return torch.load(path, map_location=map_location, weights_only=True, mmap=mmap_ok(path))
    except pickle.UnpicklingError as err:
        raise ValueError(
            f"{path} holds objects that weights_only loading refuses ({err}). Loading never runs "
            "pickled code. HINT: save only tensors, numbers, strings and containers of them, e.g. "
            "model.state_dict() instead of the model.") from None
