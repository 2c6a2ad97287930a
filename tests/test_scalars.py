"""Logged scalars never wait for the device: hpc.runtime.scalars.PendingScalars.

    python -m pytest tests/test_scalars.py
"""
from __future__ import annotations

import torch

from hpc.runtime.scalars import PendingScalars


class FakeEvent:
    """A CUDA event stand-in: done once `done` is set; synchronize() records that it was waited on."""

    def __init__(self) -> None:
        self.done, self.waited = False, False

    def query(self) -> bool:
        return self.done

    def synchronize(self) -> None:
        self.waited = True


def test_host_values_are_written_at_once():
    out, pending = [], PendingScalars()
    pending.add(lambda *a: out.append(a), "loss", torch.tensor(1.5), 3)
    pending.add(lambda *a: out.append(a), "lr", 0.25, 3)
    assert out == [("loss", 1.5, 3), ("lr", 0.25, 3)] and len(pending) == 0


def test_device_values_wait_for_their_event_only_when_asked():
    out, pending = [], PendingScalars()
    write = lambda *a: out.append(a)  # noqa: E731
    first, second = FakeEvent(), FakeEvent()
    pending._queue.extend([(write, "loss", torch.tensor(2.0), first, 1),
                           (write, "loss", torch.tensor(3.0), second, 2)])
    pending.flush()
    assert out == [] and not first.waited  # nothing copied yet: the step goes on
    first.done = True
    pending.flush()
    assert out == [("loss", 2.0, 1)] and len(pending) == 1
    pending.flush(block=True)  # the end of training: everything, in order
    assert out == [("loss", 2.0, 1), ("loss", 3.0, 2)] and second.waited
