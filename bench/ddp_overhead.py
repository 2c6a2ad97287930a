"""DDP overhead: step time with hpc.ddp.session (wrap, loader, all_reduce_mean) against hand-written
torch.distributed DDP on the same model and data (gloo, 2 ranks on this machine); and the same
with checkpoints every SAVE_EVERY steps: hpc.trainloop.TrainLoop (background saves, the stop
vote) against the hand-written loop saving model and optimizer with torch.save on rank 0.

    python -m bench --only ddp
    RANK=0 ... python -m bench.ddp_overhead --variant hpc --steps 50     # one rank (torchrun-style env)

Each launch starts 2 processes with torchrun-style variables; the variants alternate launches and
every measured step time (after warm-up) of rank 0 is pooled per variant. A step's time runs from
the top of one iteration to the top of the next, so it includes what the loop does between steps
(TrainLoop's saves and votes). Without checkpoints medians are compared; with them means, since a
save lands in one step of SAVE_EVERY and a median would not see it.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import time
from statistics import mean
from typing import Dict, List

from bench.common import REPO, Context, child_env, emit, fmt_s, free_port, median
from bench.report import Section

TARGET = 1.02
WORLD = 2
BATCH = 32
WARMUP = 10
SAVE_EVERY = 20
# variant name (command line) -> row name
VARIANTS = {"torch": "hand-written torch DDP", "hpc": "hpc.ddp.session",
            "torch-save": f"hand-written + torch.save on rank 0 every {SAVE_EVERY}",
            "trainloop": f"hpc TrainLoop, checkpoint every {SAVE_EVERY}"}


def _model_and_data():
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024),
                                torch.nn.ReLU(), torch.nn.Linear(1024, 10))
    data = torch.utils.data.TensorDataset(torch.randn(4096, 512), torch.randint(0, 10, (4096,)))
    return model, data


def _steps(model, opt, loader, reduce_mean, ticks, after_step=None) -> List[float]:
    """Train one step per item of `ticks`; the time between the tops of consecutive iterations."""
    import torch

    tops, it = [], iter(loader)
    for step in ticks:
        tops.append(time.perf_counter())
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
        if after_step is not None:
            after_step(step)
    tops.append(time.perf_counter())
    return [b - a for a, b in zip(tops, tops[1:])][WARMUP:]


def _sgd(model):
    import torch

    return torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)  # momentum: optimizer state


def with_hpc(steps: int, out: str, checkpoints: bool = False) -> List[float]:
    import hpc.ddp
    from hpc.trainloop import TrainLoop

    with hpc.ddp.session(timeout_s=120) as s:
        model, data = _model_and_data()
        model = s.wrap(model)
        opt = _sgd(model)
        loader = s.loader(data, batch_size=BATCH, seed=0)
        if not checkpoints:
            return _steps(model, opt, loader, s.all_reduce_mean, range(steps + WARMUP))
        with TrainLoop(s, out, save_every=SAVE_EVERY, tensorboard=False) as loop:
            loop.resume({"model": model, "optimizer": opt, "data": loader})
            return _steps(model, opt, loader, s.all_reduce_mean, loop.steps(steps + WARMUP))


def with_torch(steps: int, out: str, checkpoints: bool = False) -> List[float]:
    """What a user writes by hand: init from the environment, DDP, DistributedSampler."""
    import datetime
    import os

    import torch
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

        def save(step):
            if checkpoints and rank == 0 and (step + 1) % SAVE_EVERY == 0:
                torch.save({"model": model.module.state_dict(), "optimizer": opt.state_dict(),
                            "step": step}, os.path.join(out, "checkpoint.pt"))

        opt = _sgd(model)
        times = _steps(model, opt, loader, reduce_mean, range(steps + WARMUP), save)
        dist.barrier()  # rank 0 may still be saving: tearing gloo down under it aborts the peer
        return times
    finally:
        dist.destroy_process_group()


def launch(variant: str, steps: int, out) -> List[float]:
    port = str(free_port())
    procs = []
    for rank in range(WORLD):
        env = child_env({"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(WORLD),
                         "LOCAL_WORLD_SIZE": str(WORLD), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port,
                         "OMP_NUM_THREADS": "1"})
        procs.append(subprocess.Popen([sys.executable, "-m", "bench.ddp_overhead", "--variant", variant,
                                       "--steps", str(steps), "--out", str(out)], env=env, cwd=REPO, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    outs = [p.communicate(timeout=600) for p in procs]
    if any(p.returncode for p in procs):
        raise RuntimeError(f"{variant} DDP ranks failed: {[o[1][-800:] for o in outs]}")
    import json

    return json.loads(outs[0][0].strip().splitlines()[-1])["step_s"]


def _row(sec: Section, name: str, ts: List[float], base: float, stat) -> None:
    p90 = sorted(ts)[int(0.9 * (len(ts) - 1))]
    sec.rows.append([name, fmt_s(median(ts)), fmt_s(mean(ts)), fmt_s(p90), str(len(ts)),
                     f"{stat(ts) / base:.3f}x"])


def run(ctx: Context) -> Section:
    steps, rounds = (2 * SAVE_EVERY, 1) if ctx.quick else (6 * SAVE_EVERY, 3)
    sec = Section("ddp", "DDP overhead (gloo, 2 ranks)",
                  f"hpc session step time <= {TARGET} x hand-written torch DDP; TrainLoop with "
                  f"checkpoints <= {TARGET} x hand-written with torch.save on rank 0",
                  "python -m bench --only ddp" + (" --quick" if ctx.quick else ""),
                  headers=["variant", "median step", "mean step", "p90 step", "steps measured", "ratio"])
    times: Dict[str, List[float]] = {v: [] for v in VARIANTS}
    for i in range(rounds):
        for v in VARIANTS:
            times[v] += launch(v, steps, ctx.scratch(f"ddp-{v}-{i}"))
    base = median(times["torch"])
    _row(sec, VARIANTS["torch"], times["torch"], base, median)
    _row(sec, VARIANTS["hpc"], times["hpc"], base, median)
    base_save = mean(times["torch-save"])
    _row(sec, VARIANTS["torch-save"], times["torch-save"], base_save, mean)
    _row(sec, VARIANTS["trainloop"], times["trainloop"], base_save, mean)
    ratio = median(times["hpc"]) / base
    sec.verdicts.append((f"hpc session step {ratio:.3f}x the hand-written one (median; target {TARGET}x)",
                         ratio <= TARGET))
    ratio = mean(times["trainloop"]) / base_save
    sec.verdicts.append((f"TrainLoop with checkpoints {ratio:.3f}x the hand-written loop with torch.save "
                         f"(mean; target {TARGET}x)", ratio <= TARGET))
    sec.notes += [
        f"MLP 512-1024-1024-10, batch {BATCH} per rank, SGD with momentum, loss averaged over ranks every "
        f"step; {WORLD} local processes with one thread each, gloo over 127.0.0.1; {rounds} launch(es) per "
        f"variant, alternating, {WARMUP} warm-up steps dropped per launch",
        f"checkpoint rows: model and optimizer every {SAVE_EVERY} steps (TrainLoop also the data position "
        "and RNG states, written in the background, and its stop vote every step); their ratio is of means, "
        "the first two rows' of medians",
        "on a 2-core machine shared with other work the spread between launches is several percent, "
        "larger than the difference being measured: read the ratio with the p90 column"]
    return sec


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.ddp_overhead")
    p.add_argument("--variant", choices=sorted(VARIANTS), required=True)
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--out", required=True, help="directory for the checkpoints")
    a = p.parse_args()
    import torch

    torch.set_num_threads(1)
    run_variant = with_torch if a.variant.startswith("torch") else with_hpc
    step_s = run_variant(a.steps, a.out, checkpoints=a.variant in ("torch-save", "trainloop"))
    emit({"step_s": step_s})


if __name__ == "__main__":
    main()
