"""GPU benchmarks, on one GPU: DDP and FSDP step time of hpc against hand-written torch, the
checkpoint stall with device-to-host staging, the LangSplat reference stages on cuda:0.

    python -m bench.gpu                                  # with the GPU suite; writes gpu-report.md
    python -m bench.gpu_steps --pair ddp                 # one pair, JSON on stdout

DDP and FSDP run on a one-rank NCCL group (tests/gpu/onerank.py: NCCL refuses two ranks on one
GPU), hpc's Session and the hand-written loop trained in alternating blocks in one process
(bench.interleave), each step ending in a device synchronisation so that a step's time is the
device's. Sized to fit, with the GPU suite, in one 10-minute run on one H100.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any, Dict, List

from bench.common import REPO, emit, fmt_s, median
from bench.interleave import Arm, paired_ratio, pooled, run_blocks

sys.path.insert(0, str(REPO / "tests" / "gpu"))  # the one-rank group the GPU suite uses

WIDTH, DEPTH, BATCH = 2048, 4, 256
BLOCKS, BLOCK_STEPS = 30, 10
SIZES_MB = (256, 1024)
SAVES = 3


def _net():
    """fsdp_step's transformer-shaped MLP at this benchmark's width and depth (4096 samples)."""
    from bench.fsdp_step import model_and_data

    return model_and_data(WIDTH, DEPTH)


def _stepper(model, batches, reduce_mean, device):
    """One training step per call on the next of `batches` (an endless iterator)."""
    import torch

    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    def step() -> None:
        x, y = next(batches)
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        reduce_mean(loss.detach())
        torch.cuda.synchronize(device)  # a step's time is the device's, in both arms
    return step


def pair(which: str) -> Dict[str, Any]:
    """Hand-written ("torch") and hpc ("hpc") DDP or FSDP, alternating blocks on cuda:0."""
    import torch
    import torch.distributed as dist
    from onerank import OneRankSession, one_rank_group
    from torch.utils.data import DataLoader, DistributedSampler

    from bench.ddp_overhead import batches_by_hand

    with one_rank_group("cuda") as (device, _):
        def by_hand() -> Arm:
            model, data = _net()
            model = model.to(device)
            if which == "fsdp":
                from torch.distributed.device_mesh import init_device_mesh
                from torch.distributed.fsdp import fully_shard

                mesh = init_device_mesh("cuda", (1,))
                for block in model.blocks:
                    fully_shard(block, mesh=mesh)
                fully_shard(model, mesh=mesh)
            else:
                model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[device.index])
            sampler = DistributedSampler(data, num_replicas=1, rank=0, seed=0, drop_last=True)
            loader = DataLoader(data, batch_size=BATCH, sampler=sampler, drop_last=True, pin_memory=True)

            def reduce_mean(t):
                dist.all_reduce(t)
                return t / dist.get_world_size()
            return Arm("torch", _stepper(model, batches_by_hand(loader, sampler), reduce_mean, device))

        def with_hpc() -> Arm:
            s = OneRankSession(device)
            model, data = _net()
            model = s.wrap(model, strategy=which)
            batches = s.loader(data, batch_size=BATCH, seed=0).batches()  # its resumable position, as users draw
            return Arm("hpc", _stepper(model, batches, s.all_reduce_mean, device))

        a, b = by_hand(), with_hpc()
        return run_blocks(a, b, BLOCKS, BLOCK_STEPS)


def stall(size_mb: int, directory: Path) -> Dict[str, Any]:
    """Seconds the caller is blocked per save of a `size_mb` model on cuda:0: hpc's background
    DCP save (pinned device-to-host staging, then a thread writes), the same save blocking, and a
    hand-written torch.save of the state copied to the host."""
    import os

    import torch

    from hpc.checkpoint import CheckpointStore
    from hpc.checkpoint.dcp_engine import DcpEngine

    device = torch.device("cuda", 0)
    module, left, i = torch.nn.Module(), size_mb * 2**20 // 4, 0
    while left > 0:  # tensors of at most 64 MB, as a model's parameters
        n = min(left, 16 * 2**20)
        module.register_buffer(f"w{i}", torch.randn(n, device=device))
        left, i = left - n, i + 1
    engine = DcpEngine(None, pinned=True)
    store = CheckpointStore(directory / "dcp", keep=2)
    blocked: Dict[str, List[float]] = {"hpc background": [], "hpc blocking": [], "torch.save of .cpu()": []}
    step = 0
    for _ in range(SAVES):
        for name in blocked:
            step += 1
            module.w0.add_(1.0)  # the step before the save: work queued on the device
            t0 = time.perf_counter()
            if name == "torch.save of .cpu()":
                with open(directory / "sync.pt", "wb") as fh:
                    torch.save({k: v.cpu() for k, v in module.state_dict().items()}, fh)
                    fh.flush()
                    os.fsync(fh.fileno())
            else:
                blocking = name == "hpc blocking"
                store.save(step, {"step": step}, blocking=blocking,
                           sharded=lambda d, b: (engine.save(d, module, blocking=b), engine.wait)[1])
            blocked[name].append(time.perf_counter() - t0)
            store.wait()  # not charged: the next save would wait for it, training would not
    store.close()
    engine.close()
    return {"size_mb": size_mb, "blocked": {k: median(v) for k, v in blocked.items()}}


def langsplat(out: Path) -> Dict[str, Any]:
    """Both reference stages on cuda:0 (the session binds it), default scene, in this process."""
    from bench.langsplat_cams import stage_features, stage_rgb

    t0 = time.perf_counter()
    rgb = stage_rgb(out / "rgb", 300)
    rgb_s = time.perf_counter() - t0
    feats = stage_features(out / "features", out / "rgb", 200)
    return {"rgb_s": rgb_s, "psnr": rgb["psnr"], "gaussians": rgb["gaussians"], **feats}


def pair_rows(runs: Dict[str, Any], label: str) -> List[List[str]]:
    est = paired_ratio([runs], "torch", "hpc", "median")
    return [[f"{label}: hand-written", fmt_s(median(pooled([runs], "torch"))), "1.000x"],
            [f"{label}: hpc", fmt_s(median(pooled([runs], "hpc"))), est.text()]]


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.gpu_steps")
    p.add_argument("--pair", choices=("ddp", "fsdp"))
    p.add_argument("--stall-mb", type=int)
    p.add_argument("--langsplat", help="output directory of the LangSplat stages")
    p.add_argument("--dir", help="scratch directory of --stall-mb")
    a = p.parse_args()
    if a.pair:
        emit(pair(a.pair))
    elif a.stall_mb:
        emit(stall(a.stall_mb, Path(a.dir)))
    else:
        emit(langsplat(Path(a.langsplat)))


if __name__ == "__main__":
    main()
