"""FSDP step time: hpc (s.wrap(model, strategy="fsdp") in hpc.ddp.session, and the same inside a
TrainLoop that saves no checkpoint) against hand-written FSDP2 (fully_shard over
init_device_mesh) on the same model, data and sharding units; gloo, 2 ranks on this machine.

    python -m bench --only fsdp
    RANK=0 ... python -m bench.fsdp_step --variant hpc --steps 50 --out DIR   # one rank

Launches start WORLD processes with torchrun-style variables (start_ranks, also used by
bench.fsdp_checkpoint); the variants alternate launches and the step times of rank 0 after
warm-up are pooled per variant, then their medians compared. A step's time runs from the top of
one iteration to the top of the next (bench.ddp_overhead._steps), so TrainLoop's stop vote is in it.
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Dict, List

from bench.common import REPO, Context, child_env, emit, free_port, median
from bench.ddp_overhead import WARMUP, _row, _sgd, _steps
from bench.report import Section

TARGET = 1.02
WORLD = 2
BATCH = 32
WIDTH, BLOCKS = 512, 4
VARIANTS = {"torch": "hand-written FSDP2 (fully_shard per block, then the root)",
            "hpc": 's.wrap(model, strategy="fsdp")',
            "trainloop": 's.wrap(model, strategy="fsdp") in TrainLoop, no checkpoint'}


def model_and_data(width: int = WIDTH, blocks: int = BLOCKS):
    """A transformer-shaped MLP: an input layer, a ModuleList of blocks (FSDP's units), a head."""
    import torch

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inp = torch.nn.Linear(64, width)
            self.blocks = torch.nn.ModuleList(
                torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.ReLU()) for _ in range(blocks))
            self.head = torch.nn.Linear(width, 10)

        def forward(self, x):
            x = self.inp(x)
            for block in self.blocks:
                x = block(x)
            return self.head(x)

    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(4096, 64), torch.randint(0, 10, (4096,)))
    return Net(), data


def with_hpc(steps: int, out: str, trainloop: bool) -> List[float]:
    import hpc.ddp
    from hpc.trainloop import TrainLoop

    with hpc.ddp.session(timeout_s=120) as s:
        model, data = model_and_data()
        model = s.wrap(model, strategy="fsdp")
        opt = _sgd(model)
        loader = s.loader(data, batch_size=BATCH, seed=0)
        if not trainloop:
            times = _steps(model, opt, loader, s.all_reduce_mean, range(steps + WARMUP))
            s.barrier()  # as the hand-written one: no rank tears gloo down under its peer
            return times
        with TrainLoop(s, out, save_every=10**9, tensorboard=False) as loop:
            loop.resume({"model": model, "optimizer": opt, "data": loader})
            return _steps(model, opt, loader, s.all_reduce_mean, loop.steps(steps + WARMUP))


def with_torch(steps: int) -> List[float]:
    """What a user writes by hand: init from the environment, a 1-D mesh, fully_shard per block."""
    import datetime
    import os

    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.utils.data import DataLoader, DistributedSampler

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", init_method=f"tcp://{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}",
                            rank=rank, world_size=world, timeout=datetime.timedelta(seconds=120))
    try:
        model, data = model_and_data()
        mesh = init_device_mesh("cpu", (world,))
        for block in model.blocks:
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
        sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=0, drop_last=True)
        loader = DataLoader(data, batch_size=BATCH, sampler=sampler, drop_last=True)

        def reduce_mean(t):
            dist.all_reduce(t)
            return t / world

        times = _steps(model, _sgd(model), loader, reduce_mean, range(steps + WARMUP))
        # Tearing gloo down while the peer is still in its last collectives aborted a rank at
        # exit here ("terminate called without an active exception"): leave together.
        dist.barrier()
        return times
    finally:
        dist.destroy_process_group()


def start_ranks(module: str, args: List[str], world: int = WORLD) -> List[subprocess.Popen]:
    """`python -m bench.<module> args` in `world` processes of one torchrun-style group."""
    port = str(free_port())
    procs = []
    for rank in range(world):
        env = child_env({"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world),
                         "LOCAL_WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port,
                         "OMP_NUM_THREADS": "1"})
        procs.append(subprocess.Popen([sys.executable, "-m", f"bench.{module}", *args], env=env, cwd=REPO,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    return procs


def rank0_result(procs: List[subprocess.Popen], what: str, timeout: float = 600) -> Dict:
    """Wait for every rank; rank 0's last JSON line, or an error with every rank's stderr tail."""
    try:
        outs = [p.communicate(timeout=timeout) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    lines = [ln for ln in outs[0][0].splitlines() if ln.startswith("{")]
    if any(p.returncode for p in procs) or not lines:
        raise RuntimeError(f"{what}: ranks exited {[p.returncode for p in procs]}: "
                           f"{[o[1].strip()[-800:] for o in outs]}")
    return json.loads(lines[-1])


def run_ranks(module: str, args: List[str], out: Path, what: str, repeated: List[str]) -> Dict:
    """rank0_result of one launch, launched once more if a rank failed; `repeated` gets why.
    The second launch starts from an empty `out`: a TrainLoop must not resume the first's."""
    try:
        return rank0_result(start_ranks(module, args), what)
    except RuntimeError as err:
        repeated.append(str(err)[-300:])
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True)
        return rank0_result(start_ranks(module, args), what)


def repeated_note(repeated: List[str]) -> List[str]:
    return [f"{len(repeated)} launch(es) failed and were launched again; the first: {repeated[0]}"] if repeated else []


def run(ctx: Context) -> Section:
    steps, rounds = (5, 1) if ctx.quick else (100, 3)
    sec = Section("fsdp", "FSDP step time (gloo, 2 ranks)",
                  f"hpc FSDP step time <= {TARGET} x hand-written FSDP2 (median)",
                  "python -m bench --only fsdp" + (" --quick" if ctx.quick else ""),
                  headers=["variant", "median step", "mean step", "p90 step", "steps measured", "ratio"])
    times: Dict[str, List[float]] = {v: [] for v in VARIANTS}
    repeated: List[str] = []
    for i in range(rounds):
        for v in VARIANTS:
            out = ctx.scratch(f"fsdp-{v}-{i}")
            args = ["--variant", v, "--steps", str(steps), "--out", str(out)]
            times[v] += run_ranks("fsdp_step", args, out, f"FSDP variant {v}", repeated)["step_s"]
    base = median(times["torch"])
    for v, name in VARIANTS.items():
        _row(sec, name, times[v], base, median)
    for v in ("hpc", "trainloop"):
        ratio = median(times[v]) / base
        sec.verdicts.append((f"{VARIANTS[v]}: step {ratio:.3f}x the hand-written FSDP2 one (median; "
                             f"target {TARGET}x)", ratio <= TARGET))
    sec.notes += [
        f"MLP 64-{WIDTH} then {BLOCKS} blocks of {WIDTH}x{WIDTH} (each an FSDP unit, as hpc.fsdp shards a "
        f"ModuleList's elements) then a 10-way head; batch {BATCH} per rank, SGD with momentum, loss averaged "
        f"over ranks every step; {WORLD} local processes with one thread each, gloo over 127.0.0.1",
        f"{rounds} launch(es) per variant, alternating, {WARMUP} warm-up steps dropped per launch; "
        "hand-written data comes from DistributedSampler, hpc's from s.loader (its resumable loader)",
        "on a 2-core machine shared with other work the spread between launches is several percent, "
        "as large as the difference being measured: read the ratio with the p90 column"] + repeated_note(repeated)
    return sec


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.fsdp_step")
    p.add_argument("--variant", choices=sorted(VARIANTS), required=True)
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--out", required=True, help="TrainLoop's directory")
    a = p.parse_args()
    import torch

    torch.set_num_threads(1)
    if a.variant == "torch":
        emit({"step_s": with_torch(a.steps)})
    else:
        emit({"step_s": with_hpc(a.steps, a.out, trainloop=a.variant == "trainloop")})


if __name__ == "__main__":
    main()
