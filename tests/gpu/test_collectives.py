"""A Session's collectives and wrappers on a one-rank group: NCCL on cuda:0, gloo on the CPU.

    python -m pytest -n 0 tests/gpu/test_collectives.py

Reductions, DDP with device_ids, the device mesh, FSDP's mixed precision, a meta model given
storage on the device, the stop vote and TrainLoop's object broadcast. Two ranks on two GPUs:
test_nccl_processes.py.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.distributed as dist
from onerank import OneRankSession

from hpc.recovery.stopsignal import StopFlag, StopVote
from hpc.trainloop import TrainLoop


def test_reductions_reach_the_groups_device_and_come_back(group):
    device, backend = group
    s = OneRankSession(device)
    assert dist.get_backend() == backend and s.distributed
    assert s.all_reduce_mean(2.5) == 2.5 and isinstance(s.all_reduce_sum(2.5), float)
    for where in {torch.device("cpu"), device}:  # NCCL reduces CUDA tensors only: a CPU one is moved
        value = torch.tensor([1.0, -3.0], device=where)
        mean, total = s.all_reduce_mean(value), s.all_reduce_sum(value)
        assert mean.device == where and total.device == where
        assert torch.equal(mean.cpu(), value.cpu()) and torch.equal(total.cpu(), value.cpu())
        assert mean.data_ptr() != value.data_ptr()  # a new tensor: the caller's is not reduced in place
    steps = s.all_reduce_mean(torch.tensor([3, 5]))  # integers: a true division, not a floor
    assert steps.dtype.is_floating_point and steps.tolist() == [3.0, 5.0]
    s.barrier()  # device_ids=[0] on NCCL: returns at once with one rank


def test_ddp_binds_the_sessions_device(group):
    device, _ = group
    s = OneRankSession(device)
    torch.manual_seed(0)
    plain = torch.nn.Linear(8, 2)
    wrapped = s.wrap(torch.nn.Linear(8, 2))
    wrapped.module.load_state_dict(plain.state_dict())
    assert isinstance(wrapped, torch.nn.parallel.DistributedDataParallel)
    assert wrapped.device_ids == ([device.index] if device.type == "cuda" else None)
    assert all(p.device == device for p in wrapped.parameters())
    x, y = torch.randn(16, 8), torch.randn(16, 2)
    for model, where in ((wrapped, device), (plain, torch.device("cpu"))):
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        torch.nn.functional.mse_loss(model(x.to(where)), y.to(where)).backward()  # DDP's all-reduce
        opt.step()
    for got, want in zip(wrapped.module.parameters(), plain.parameters()):  # one rank: the mean is the grad
        torch.testing.assert_close(got.detach().cpu(), want.detach(), rtol=1e-4, atol=1e-5)


def test_the_mesh_is_on_the_sessions_device_type(group):
    device, backend = group
    mesh = OneRankSession(device).mesh
    assert mesh.device_type == device.type and tuple(mesh.shape) == (1,)
    assert dist.get_backend(mesh.get_group()) == backend


class Blocks(torch.nn.Module):
    """Two FSDP units (a ModuleList's elements) and the root's head."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(64, 64) for _ in range(2))
        self.head = torch.nn.Linear(64, 4)

    def forward(self, x):
        for layer in self.layers:
            x = torch.relu(layer(x))
        return self.head(x)


def test_fsdp_computes_in_bf16_and_keeps_fp32_shards_and_grads_on_cuda(group):
    device, _ = group
    s = OneRankSession(device, bf16=True)
    model = s.wrap(Blocks(), strategy="fsdp")
    seen = []
    # FSDP's own hooks come first: before the unit's forward its parameters are gathered (in the
    # compute dtype), after it they are sharded again, so the weight is looked at in a pre-hook
    layer = model.layers[0]
    layer.register_forward_pre_hook(lambda m, inp: seen.append((m.weight.dtype, inp[0].dtype,
                                                                type(m.weight.data).__name__)))
    layer.register_forward_hook(lambda m, inp, out: seen.append(out.dtype))
    out = model(torch.randn(8, 64, device=device))
    out.float().sum().backward()
    compute = torch.bfloat16 if device.type == "cuda" else torch.float32  # bf16 is for CUDA only
    assert seen == [(compute, compute, "Tensor"), compute] and out.dtype == compute  # gathered, not a shard
    for p in model.parameters():
        local = p.to_local()  # FSDP2 keeps DTensor shards
        assert local.dtype == torch.float32 and local.device == device
        assert p.grad is not None and p.grad.to_local().dtype == torch.float32


@pytest.mark.parametrize("strategy", ["fsdp", "ddp"])
def test_a_meta_model_gets_initialised_storage_on_the_device(group, strategy):
    device, _ = group
    s = OneRankSession(device)
    with torch.device("meta"):
        net = Blocks()
    model = s.wrap(net, strategy=strategy)
    for name, p in model.named_parameters():
        t = p.to_local() if hasattr(p, "to_local") else p
        assert t.device == device and not t.is_meta, name
        bound = 1 / math.sqrt(64)  # nn.Linear's reset_parameters: U(-1/sqrt(fan_in), 1/sqrt(fan_in))
        values = t.detach().float().cpu()
        assert torch.isfinite(values).all() and values.abs().max() <= bound + 1e-6, name
        if values.dim() == 2:
            assert values.std() > bound / 3, name  # drawn, not zeros or a constant
            assert not torch.equal(values[0], values[-1]), name  # every row its own draw
    y = model(torch.randn(2, 64, device=device))
    assert y.shape == (2, 4) and torch.isfinite(y).all()


def test_the_stop_vote_reads_the_agreed_flag_one_poll_later(group):
    device, _ = group
    flag = StopFlag()
    vote = StopVote(flag, device=device)
    assert vote.poll(pace=1500) is None  # launches the first vote; nothing launched before it
    flag.reason, flag.signal = "preempt", "SIGTERM"  # what the handler records
    assert vote.poll(pace=2500) is None and vote.agreed_pace == 1500  # the vote launched before the flag
    request = vote.poll(pace=0)
    assert request is not None and request.reason == "preempt" and request.signal == "SIGTERM"
    assert vote.agreed_pace == 2500
    if device.type == "cuda":  # read through pinned memory behind an event, never .item()
        assert vote._buf.device == device and vote._host.is_pinned()
    vote.close()


def test_trainloop_broadcasts_rank_0s_decision_over_the_group(group, tmp_path):
    device, _ = group
    s = OneRankSession(device)
    loop = TrainLoop(s, tmp_path, tensorboard=False, watchdog_s=0)
    try:
        decision = {"action": "requeue", "reason": "preempt", "count": 3, "ids": [1, 2]}
        assert loop._broadcast(decision) == decision
        assert loop._broadcast(None) is None
    finally:
        loop.flag.uninstall()
        loop.store.close()
