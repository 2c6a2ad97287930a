"""Scalars logged from the training step without waiting for the device.

    pending = PendingScalars()
    pending.add(writer.add_scalar, "loss", loss, step)   # a CUDA tensor: copied behind an event
    pending.flush()                                      # writes those whose copy has landed
    pending.flush(block=True)                            # at the end: everything

`float(loss)` or `loss.item()` on a CUDA tensor waits until every kernel queued before it has run:
the host stops feeding the GPU once per logged value. Here a device tensor is copied to pinned
host memory with non_blocking=True and an event recorded behind the copy; the value is written
once the event has passed, at a later add() or flush(), so the step never waits. A CPU tensor or
a number is written at once. The written value is the one the tensor had when add() was called.
"""

from __future__ import annotations

from collections import deque
from pathlib import Path
from typing import Any, Callable, Deque, Tuple

import torch

from hpc.runtime.session import NullWriter

Write = Callable[[str, float, int], Any]


class PendingScalars:
    """Device scalars on their way to the host, in the order they were logged."""

    def __init__(self) -> None:
        self._queue: Deque[Tuple[Write, str, torch.Tensor, Any, int]] = deque()

    def add(self, write: Write, tag: str, value: Any, step: int) -> None:
        if torch.is_tensor(value) and value.is_cuda:
            host = value.detach().to("cpu", non_blocking=True)  # lands in pinned memory
            event = torch.cuda.Event()
            event.record(torch.cuda.current_stream(value.device))  # the copy's stream, on its own device
            self._queue.append((write, tag, host, event, step))
        else:
            write(tag, float(value), step)
        self.flush()

    def flush(self, block: bool = False) -> None:
        """Write every value whose copy has completed; with block, wait for all of them."""
        while self._queue:
            write, tag, host, event, step = self._queue[0]
            if not block and not event.query():
                return
            event.synchronize()
            self._queue.popleft()
            write(tag, float(host), step)

    def __len__(self) -> int:
        return len(self._queue)


class StepLog:
    """A training loop's scalars: on rank 0 only, into TensorBoard, never waiting for the device.
    Steps up to `resumed()` (the step the loop resumed after) were logged by the attempt that saved
    the checkpoint: skipped, and the events an earlier attempt logged after it are purged when the
    writer opens."""

    def __init__(self, session: Any, directory: Path, resumed: Callable[[], int], tensorboard: bool = True) -> None:
        self.s, self.directory, self.tensorboard = session, Path(directory), tensorboard
        self.resumed = resumed
        self._writer: Any = None
        self._pending = PendingScalars()  # logged device values on their way to the host

    @property
    def writer(self) -> Any:
        if self._writer is None:
            # purge_step drops events at or after it, logged by the attempt that was stopped
            # after its last checkpoint; they are logged again, once, by this attempt.
            purge = self.resumed() + 1 if self.resumed() else None
            self._writer = (self.s.writer(self.directory, purge_step=purge) if self.tensorboard
                            else NullWriter())
        return self._writer

    def log(self, tag: str, value: Any, step: int) -> None:
        if step > self.resumed() and self.tensorboard and self.s.is_main:  # elsewhere: no device wait
            self._pending.add(self.writer.add_scalar, tag, value, step)

    def close(self) -> None:
        if self._writer is not None:
            self._pending.flush(block=True)
            self._writer.close()
