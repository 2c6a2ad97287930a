"""DDP overhead: step time with hpc.ddp.session (wrap, loader, all_reduce_mean) against hand-written
torch.distributed DDP on the same model and data (gloo, 2 ranks on this machine).

    python -m bench --only ddp
    RANK=0 ... python -m bench.ddp_overhead --variant hpc --steps 50     # one rank (torchrun-style env)

Each launch starts 2 processes with torchrun-style variables; the variants alternate launches and
every measured step time (after warm-up) of rank 0 is pooled per variant; medians are compared.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import time
from typing import Dict, List

from bench.common import REPO, Context, child_env, emit, fmt_s, free_port, median
from bench.report import Section

TARGET = 1.02
WORLD = 2
BATCH = 32
WARMUP = 10


def _model_and_data():
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024),
                                torch.nn.ReLU(), torch.nn.Linear(1024, 10))
    data = torch.utils.data.TensorDataset(torch.randn(4096, 512), torch.randint(0, 10, (4096,)))
    return model, data


def _steps(model, loader, reduce_mean, steps: int) -> List[float]:
    import torch

    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    times, it = [], iter(loader)
    for _ in range(steps + WARMUP):
        t0 = time.perf_counter()
        try:
            x, y = next(it)
        except StopIteration:
            it = iter(loader)
            x, y = next(it)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        reduce_mean(loss.detach())  # the logged loss, averaged over ranks
        times.append(time.perf_counter() - t0)
    return times[WARMUP:]


def with_hpc(steps: int) -> List[float]:
    import hpc.ddp

    with hpc.ddp.session(timeout_s=120) as s:
        model, data = _model_and_data()
        model = s.wrap(model)
        loader = s.loader(data, batch_size=BATCH, seed=0)
        return _steps(model, loader, s.all_reduce_mean, steps)


def with_torch(steps: int) -> List[float]:
    """What a user writes by hand: init from the environment, DDP, DistributedSampler."""
    import datetime
    import os

    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DataLoader, DistributedSampler

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", init_method=f"tcp://{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}",
                            rank=rank, world_size=world, timeout=datetime.timedelta(seconds=120))
    try:
        model, data = _model_and_data()
        model = DistributedDataParallel(model)
        sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=0, drop_last=True)
        loader = DataLoader(data, batch_size=BATCH, sampler=sampler, drop_last=True)

        def reduce_mean(t):
            dist.all_reduce(t)
            return t / world

        return _steps(model, loader, reduce_mean, steps)
    finally:
        dist.destroy_process_group()


def launch(variant: str, steps: int) -> List[float]:
    port = str(free_port())
    procs = []
    for rank in range(WORLD):
        env = child_env({"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(WORLD),
                         "LOCAL_WORLD_SIZE": str(WORLD), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port,
                         "OMP_NUM_THREADS": "1"})
        procs.append(subprocess.Popen([sys.executable, "-m", "bench.ddp_overhead", "--variant", variant,
                                       "--steps", str(steps)], env=env, cwd=REPO, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    outs = [p.communicate(timeout=600) for p in procs]
    if any(p.returncode for p in procs):
        raise RuntimeError(f"{variant} DDP ranks failed: {[o[1][-800:] for o in outs]}")
    import json

    return json.loads(outs[0][0].strip().splitlines()[-1])["step_s"]


def run(ctx: Context) -> Section:
    steps, rounds = (20, 1) if ctx.quick else (60, 3)
    sec = Section("ddp", "DDP overhead (gloo, 2 ranks)", f"hpc session step time <= {TARGET} x hand-written torch DDP",
                  "python -m bench --only ddp" + (" --quick" if ctx.quick else ""),
                  headers=["variant", "median step", "p90 step", "steps measured", "ratio"])
    times: Dict[str, List[float]] = {"hand-written torch DDP": [], "hpc.ddp.session": []}
    for _ in range(rounds):
        times["hand-written torch DDP"] += launch("torch", steps)
        times["hpc.ddp.session"] += launch("hpc", steps)
    base = median(times["hand-written torch DDP"])
    for name, ts in times.items():
        p90 = sorted(ts)[int(0.9 * (len(ts) - 1))]
        sec.rows.append([name, fmt_s(median(ts)), fmt_s(p90), str(len(ts)), f"{median(ts) / base:.3f}x"])
    ratio = median(times["hpc.ddp.session"]) / base
    sec.verdicts.append((f"hpc session step {ratio:.3f}x the hand-written one (target {TARGET}x)", ratio <= TARGET))
    sec.notes += [
        f"MLP 512-1024-1024-10, batch {BATCH} per rank, SGD, loss averaged over ranks every step; "
        f"{WORLD} local processes with one thread each, gloo over 127.0.0.1; {rounds} launch(es) per variant, "
        f"alternating, {WARMUP} warm-up steps dropped per launch",
        "on a 2-core machine shared with other work the spread between launches is several percent, "
        "larger than the difference being measured: read the ratio with the p90 column"]
    return sec


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.ddp_overhead")
    p.add_argument("--variant", choices=["hpc", "torch"], required=True)
    p.add_argument("--steps", type=int, default=50)
    a = p.parse_args()
    import torch

    torch.set_num_threads(1)
    step_s = (with_hpc if a.variant == "hpc" else with_torch)(a.steps)
    emit({"step_s": step_s})


if __name__ == "__main__":
    main()
