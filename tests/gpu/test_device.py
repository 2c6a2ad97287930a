"""A task's device: binding, TF32, bf16 autocast, pinned loaders, the CUDA generator's state.

    python -m pytest -n 0 tests/gpu/test_device.py
"""

from __future__ import annotations

import io

import pytest
import torch
from marks import needs_cuda, needs_two_gpus
from onerank import device_of

import hpc.ddp
from hpc.runtime import rng
from hpc.runtime.devicebind import describe
from hpc.runtime.envparse import from_environ
from hpc.runtime.session import Session


@needs_cuda
def test_one_task_binds_cuda_0_and_nccl():
    env = from_environ({})
    assert hpc.ddp._pick_device(env) == torch.device("cuda", 0)
    info = describe(env, probe_torch=True)
    assert (info["device"], info["backend"]) == ("cuda:0", "nccl")
    with hpc.ddp.session(env=env) as s:
        assert s.device == torch.device("cuda", 0)
        model = s.wrap(torch.nn.Linear(4, 4))
        assert next(model.parameters()).device == torch.device("cuda", 0)


@needs_two_gpus
def test_tasks_sharing_a_node_bind_cuda_local_rank():
    env = from_environ({"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2",
                        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"})
    assert hpc.ddp._pick_device(env) == torch.device("cuda", 1)
    assert describe(env, probe_torch=True)["device"] == "cuda:1"


def _matmul_error() -> float:
    """Largest error of a float32 matmul on cuda:0 against the same product in float64."""
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(1024, 1024, generator=g), torch.randn(1024, 1024, generator=g)
    exact = a.double() @ b.double()
    got = (a.cuda() @ b.cuda()).cpu().double()
    return float((got - exact).abs().max())


@needs_cuda
def test_the_tf32_switch_decides_what_a_float32_matmul_computes_in():
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    try:
        with hpc.ddp.session(env=from_environ({}), tf32=True):
            assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
            with_tf32 = _matmul_error()
        with hpc.ddp.session(env=from_environ({}), tf32=False):
            assert not (torch.backends.cuda.matmul.allow_tf32 or torch.backends.cudnn.allow_tf32)
            full = _matmul_error()
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved
    # TF32 keeps 10 bits of mantissa, float32 23: over sums of 1024 products the gap is 100x or more
    assert full < 1e-2 and with_tf32 > 10 * full, (with_tf32, full)


def test_bf16_autocast_computes_in_bf16_on_cuda_only(kind):
    device = device_of(kind)
    layer = torch.nn.Linear(16, 16).to(device)
    x = torch.randn(4, 16, device=device)
    for bf16 in (True, False):
        s = Session(from_environ({}), device, bf16=bf16)
        with s.autocast():
            y = layer(x)
        expected = torch.bfloat16 if bf16 and device.type == "cuda" else torch.float32
        assert y.dtype == expected and y.device == x.device
        assert layer.weight.dtype == torch.float32  # the parameters keep their precision


def test_a_sessions_loader_pins_its_batches_on_cuda(kind):
    device = device_of(kind)
    data = torch.utils.data.TensorDataset(torch.arange(64.0).reshape(32, 2), torch.arange(32))
    s = Session(from_environ({}), device)
    loader = s.loader(data, batch_size=8, seed=0)
    assert loader.pin_memory == (device.type == "cuda")
    x, y = next(iter(loader))
    assert x.device.type == "cpu" and x.is_pinned() == (device.type == "cuda")
    moved = x.to(device, non_blocking=True)  # what a training step does with a pinned batch
    assert torch.equal(moved.cpu(), x) and sorted(y.tolist()) == sorted(set(y.tolist()))
    assert not s.loader(data, batch_size=8, pin_memory=False).pin_memory  # the caller's choice wins


def _draws(device: torch.device) -> list:
    return [torch.randn(3, device=device).cpu(), torch.rand(2).tolist()]


def test_rng_capture_repeats_the_draws_of_this_ranks_device(kind):
    device = device_of(kind)
    torch.randn(1, device=device)  # on CUDA: the context exists, as in a training task
    state = rng.capture()
    if device.type == "cuda" or not torch.cuda.is_initialized():  # a CPU test after a CUDA one sees it too
        assert (state["cuda"] is not None) == (device.type == "cuda")
    first = _draws(device)
    buf = io.BytesIO()
    torch.save(state, buf)  # the checkpoint's round trip: plain data only
    buf.seek(0)
    rng.restore(torch.load(buf, weights_only=True))
    if device.type == "cuda":  # restored on this device, before the draws move it on
        assert state["cuda"].dtype == torch.uint8
        assert torch.equal(state["cuda"], torch.cuda.get_rng_state(0))
    again = _draws(device)
    assert torch.equal(first[0], again[0]) and first[1] == again[1]


@pytest.mark.parametrize("tf32", [True, False])
def test_the_tf32_flags_are_left_alone_on_the_cpu(tf32):
    """No CUDA device bound: the session leaves the process-wide CUDA switches as they were."""
    saved = torch.backends.cuda.matmul.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = not tf32
        hpc.ddp._set_precision(torch.device("cpu"), tf32)
        assert torch.backends.cuda.matmul.allow_tf32 == (not tf32)
        hpc.ddp._set_precision(torch.device("cuda", 0), tf32)  # only sets flags: no device needed
        assert torch.backends.cuda.matmul.allow_tf32 == tf32
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved
