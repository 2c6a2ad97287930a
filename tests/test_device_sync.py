"""Device synchronisation for processes that drive several GPUs, on a CPU-only machine.

A tensor subclass that keeps its data in CPU memory but reports itself on cuda:N stands in for
GPU memory; torch.cuda's synchronize, device, current_stream and Event are replaced by recorders.
What is checked is which devices and streams hpc waits on, and in which order.
"""

import contextlib

import pytest
import torch
import torch.distributed as dist

from hpc.checkpoint.staging import Staging, source_devices, tensors_in
from hpc.recovery.stopsignal import StopFlag, StopVote


class OnGpu(torch.Tensor):
    index = 0
    log: list = []

    @property
    def device(self):
        return torch.device("cuda", self.index)

    @property
    def is_cuda(self):
        return True

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if getattr(func, "__name__", "") == "copy_" and len(args) > 1 and isinstance(args[1], OnGpu):
            cls.log.append(("read", args[1].index))
        return super().__torch_function__(func, types, args, kwargs or {})


def on(index: int, t: torch.Tensor) -> torch.Tensor:
    return t.as_subclass(type(f"OnGpu{index}", (OnGpu,), {"index": index}))


@pytest.fixture
def fake_cuda(monkeypatch):
    log: list = []
    OnGpu.log = log
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: log.append(("sync", str(device))))
    return log


def test_staging_waits_on_every_source_device_before_and_after_the_copies(fake_cuda):
    state = {"model": {"w": on(1, torch.ones(4)), "b": on(0, torch.zeros(2))}, "cpu": torch.ones(3),
             "opt": [on(1, torch.full((2,), 7.0))]}
    copy = Staging(threads=1).stage(state, cpu_too=True)
    syncs = [i for i, e in enumerate(fake_cuda) if e[0] == "sync"]
    reads = [i for i, e in enumerate(fake_cuda) if e[0] == "read"]
    assert [fake_cuda[i][1] for i in syncs] == ["cuda:0", "cuda:1", "cuda:0", "cuda:1"]
    # both devices drained before the first read of either, and again after the last
    assert syncs[1] < reads[0] and reads[-1] < syncs[2] and len(reads) == 3
    assert torch.equal(copy["opt"][0].as_subclass(torch.Tensor), torch.full((2,), 7.0))


def test_the_devices_of_a_nested_state_in_index_order():
    state = {"a": [on(3, torch.ones(1)), (on(0, torch.ones(1)),)], "b": torch.ones(1), "c": "x"}
    assert source_devices(tensors_in(state)) == [torch.device("cuda", 0), torch.device("cuda", 3)]
    assert source_devices(tensors_in({"cpu": torch.ones(1)})) == []


def test_a_cpu_only_state_waits_on_no_device(fake_cuda):
    Staging(threads=1).stage({"w": torch.ones(2)}, cpu_too=True)
    assert fake_cuda == []


class FakeEvent:
    def __init__(self):
        self.streams = []

    def record(self, stream=None):
        self.streams.append(stream)

    def synchronize(self):
        pass

    def query(self):
        return True


@pytest.fixture
def one_rank(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_the_stop_vote_copies_and_records_on_its_own_devices_stream(fake_cuda, monkeypatch, one_rank):
    entered = []

    @contextlib.contextmanager
    def device(d):
        entered.append(str(d))
        yield

    monkeypatch.setattr(torch.cuda, "device", device)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda d=None: f"stream of {d}")
    vote = StopVote(StopFlag(), device="cuda:1")
    vote._buf, vote._host, vote._event = on(1, torch.zeros(2, dtype=torch.int32)), torch.zeros(2, dtype=torch.int32), FakeEvent()
    assert vote.poll() is None  # the current device is cuda:0 (never switched): the vote is on cuda:1
    assert entered == ["cuda:1"] and vote._event.streams == ["stream of cuda:1"]
    vote.close()


def test_a_logged_scalar_is_waited_for_on_its_own_devices_stream(fake_cuda, monkeypatch):
    from hpc.runtime.scalars import PendingScalars

    events = []
    monkeypatch.setattr(torch.cuda, "Event", lambda: events.append(FakeEvent()) or events[-1])
    monkeypatch.setattr(torch.cuda, "current_stream", lambda d=None: f"stream of {d}")
    written = []
    PendingScalars().add(lambda tag, v, step: written.append((tag, v, step)), "loss", on(2, torch.tensor(0.5)), 3)
    assert [e.streams for e in events] == [["stream of cuda:2"]] and written == [("loss", 0.5, 3)]
