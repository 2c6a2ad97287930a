"""Checkpoints of device state: pinned staging after every stream, DCP saves and loads of CUDA
tensors, the forked writer of a process with a CUDA context, scalars logged without a device wait.

    python -m pytest -n 0 tests/gpu/test_checkpoint_gpu.py
"""

from __future__ import annotations

import time

import pytest
import torch
from onerank import OneRankSession, device_of

from hpc.checkpoint import CheckpointStore
from hpc.checkpoint.background_writer import ForkJob
from hpc.checkpoint.dcp_engine import DcpEngine
from hpc.checkpoint.dcp_index import merge_metadata
from hpc.checkpoint.staging import Staging
from hpc.runtime.scalars import PendingScalars

SLEEP_S = 0.3  # a kernel this long keeps a stream busy while the host goes on


def busy(seconds: float) -> None:
    """Queue a kernel that spins on the current stream for about `seconds` (clocks of 2 GHz or less)."""
    torch.cuda._sleep(int(2e9 * seconds))


def test_staging_copies_what_every_stream_wrote_into_pinned_buffers(kind):
    device = device_of(kind)
    live = torch.zeros(1 << 20, device=device)
    if device.type == "cuda":
        side = torch.cuda.Stream(device)
        with torch.cuda.stream(side):  # the update lands late, on a stream that is not the current one
            busy(SLEEP_S)
            live.fill_(7.0)
    else:
        live.fill_(7.0)
    staging = Staging()
    copy = staging.stage({"w": live, "step": 3}, cpu_too=True, pin=True)
    w = copy["w"]  # read at once: the copy has landed when stage() returns
    assert w.device.type == "cpu" and copy["step"] == 3
    assert w.is_pinned() == (device.type == "cuda")  # pinned for device tensors only
    assert bool((w == 7.0).all()), "the copy ran before the side stream's update"
    live.fill_(9.0)
    again = staging.stage({"w": live, "step": 4}, cpu_too=True, pin=True)["w"]
    assert again.data_ptr() == w.data_ptr() and bool((again == 9.0).all())  # the buffer is reused


def _model(device, seed: int):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8)).to(device)


def _trained(s, seed: int, strategy: str):
    """A model wrapped as `strategy` (one rank: FSDP shards it, DDP is left plain as TrainLoop saves
    it) and its optimizer, after one step."""
    device = s.device
    model = _model(device, seed)
    model = s.wrap(model, strategy="fsdp") if strategy == "fsdp" else model
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    model(torch.randn(4, 32, device=device)).sum().backward()
    opt.step()
    return model, opt


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_dcp_saves_device_tensors_asynchronously_and_loads_them_back(group, tmp_path, strategy):
    device, _ = group
    s = OneRankSession(device)
    model, opt = _trained(s, 0, strategy)
    expected = {k: (v.full_tensor() if hasattr(v, "full_tensor") else v).detach().cpu().clone()
                for k, v in model.state_dict().items()}
    engine = DcpEngine(s)
    assert engine.pinned == (device.type == "cuda")
    engine.save(tmp_path / "step", model, opt, collectives=False)  # TrainLoop's kind of save
    with torch.no_grad():  # training goes on at once: the staged copy must not see this
        for p in model.parameters():
            p.add_(100.0)
    engine.wait()
    merge_metadata(tmp_path / "step", 1)
    buffers = engine._stager._staging._buffers.values()
    # device tensors stage into pinned buffers; Adam's step counters live on the CPU and stay pageable
    assert buffers and all(pinned == (device.type == "cuda" and buf.dim() > 0) for buf, pinned in buffers)
    assert any(not buf.dim() for buf, _ in buffers)
    fresh, fresh_opt = _trained(s, 1, strategy)
    engine.load(tmp_path / "step", fresh, fresh_opt)
    engine.close()
    for name, value in fresh.state_dict().items():
        local = value.to_local() if hasattr(value, "to_local") else value
        assert local.device == device, name
        full = value.full_tensor() if hasattr(value, "full_tensor") else value
        assert torch.equal(full.cpu(), expected[name]), name
    state = next(iter(fresh_opt.state.values()))
    moment = state["exp_avg"]
    assert (moment.to_local() if hasattr(moment, "to_local") else moment).device == device


def test_the_forked_writer_of_a_process_with_a_cuda_context_writes_the_state(kind, tmp_path):
    device = device_of(kind)
    weights = torch.arange(4096.0, device=device)
    store = CheckpointStore(tmp_path / "ckpt", keep=2, mode="fork")
    store.save(1, {"model": {"w": weights}, "step": 1})
    assert isinstance(store._job, ForkJob)  # the child got a CPU copy; it never touches CUDA
    weights.add_(1.0)  # training goes on in the parent, on the device
    store.wait()
    assert weights.device == device and float(weights[0]) == 1.0  # the parent's context still works
    saved = store.load(1)
    assert torch.equal(saved["model"]["w"], torch.arange(4096.0)) and saved["step"] == 1
    store.close()


def test_a_logged_device_scalar_neither_waits_nor_changes_after_add(kind):
    device = device_of(kind)
    written = []
    pending = PendingScalars()
    loss = torch.full((), 3.0, device=device)
    if device.type == "cuda":
        torch.cuda.synchronize()
        busy(SLEEP_S)  # the device is busy: an .item() here would wait this long
    loss.add_(1.0)  # queued behind the kernel: the value at add() is 4
    t0 = time.perf_counter()
    pending.add(lambda tag, value, step: written.append((tag, value, step)), "loss", loss, 7)
    waited = time.perf_counter() - t0
    loss.fill_(100.0)  # a later step reuses the tensor
    if device.type == "cuda":
        assert waited < SLEEP_S / 2 and len(pending) == 1 and written == []
    pending.flush(block=True)
    assert written == [("loss", 4.0, 7)] and len(pending) == 0
