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
from typing import Any, Callable, Deque, Tuple

import torch

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
