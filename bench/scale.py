"""Costs per rank as the world grows: memory while wrapping a meta-built model, bytes read at a
commit and at a resume, and commit latency at world size 2, 4, 8 and 16 (gloo, local processes).

    python -m bench --only scale [--quick]
    RANK=0 ... python -m bench.scale --mode io --out DIR --blocks 64     # one rank of a launch

io (WORLD_IO ranks): every rank builds BLOCKS Linear(WIDTH, WIDTH) on the meta device and wraps it
under FSDP (shard, to_empty, reset_parameters): its resident memory growth from just before the
wrap to the peak after it (ru_maxrss). TrainLoop then saves the model through DCP (blocking); the
bytes each rank read meanwhile (/proc/self/io: rchar, every read call; read_bytes, from the disk)
are its reads at commit. The checkpoint's pages are dropped from the page cache (posix_fadvise,
every file, every rank), and a second TrainLoop resumes: its reads are the rank's reads at resume.
commit (world W, one Linear(8, 8)): the median time of rank 0 inside TrainLoop's blocking save
(each rank's DCP write, checksums of its own file, rank 0's marker and renames), beside the median
of a gloo barrier at the same world size: the collective's own cost.
"""
from __future__ import annotations

import argparse
import os
import resource
import time
from pathlib import Path
from typing import Dict, List

from bench.common import Context, emit, fmt_s, median
from bench.ranks import repeated_note, run_ranks
from bench.report import Section

WIDTH = 2048  # one block (FSDP's unit): 16 MiB of float32 weights
BLOCKS, QUICK_BLOCKS = 64, 4  # 1 GiB; --quick 64 MiB
WORLD_IO = 4
WORLDS, QUICK_WORLDS = (2, 4, 8, 16), (2, 4)
SAVES = 5
OVERHEAD = 64 * 2**20  # the fixed part of the memory target: allocator slack, FSDP's buffers


def _io() -> Dict[str, int]:
    fields = dict(line.split(": ") for line in Path("/proc/self/io").read_text().splitlines())
    return {"rchar": int(fields["rchar"]), "read_bytes": int(fields["read_bytes"])}


def _delta(before: Dict[str, int]) -> Dict[str, int]:
    return {k: v - before[k] for k, v in _io().items()}


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _evict(directory: Path) -> None:
    for f in directory.rglob("*"):
        if f.is_file():
            fd = os.open(f, os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def _meta_model(blocks: int, width: int):
    import torch

    with torch.device("meta"):
        return torch.nn.Sequential(*(torch.nn.Linear(width, width) for _ in range(blocks)))


def io(out: Path, blocks: int) -> None:
    import torch.distributed as dist

    import hpc.ddp
    from hpc.fsdp import materialize, shard
    from hpc.trainloop import TrainLoop

    with hpc.ddp.session(timeout_s=600) as s:
        materialize(shard(_meta_model(2, 8), s.mesh), s.device)  # FSDP's code loaded: not the model's memory
        before = _rss()
        model = s.wrap(_meta_model(blocks, WIDTH), strategy="fsdp")
        report = {"grown": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before,
                  "model_bytes": sum(p.numel() * 4 for p in model.parameters()),
                  "unit_bytes": (WIDTH * WIDTH + WIDTH) * 4}
        with TrainLoop(s, out, save_every=10**9, keep=1, tensorboard=False) as loop:
            loop.resume({"model": model})
            loop.step = 1
            t0 = _io()
            loop.save(blocking=True)
            report["commit"] = _delta(t0)
        step = out / "checkpoints" / "step-1"
        _evict(step)
        s.barrier()
        model = s.wrap(_meta_model(blocks, WIDTH), strategy="fsdp")
        with TrainLoop(s, out, keep=1, tensorboard=False) as loop:
            t0 = _io()
            loop.resume({"model": model})
            report["resume"] = _delta(t0)
        report["share"] = (step / f"__{s.rank}_0.distcp").stat().st_size
        report["metadata"] = sum((step / n).stat().st_size for n in (".metadata", "COMPLETE.json", "shared.pt",
                                                                     f"rank-{s.rank}.pt"))
        reports: List[Dict] = [{}] * s.world_size
        dist.all_gather_object(reports, report)
        if s.is_main:
            emit({"ranks": reports})


def commit(out: Path) -> None:
    import torch
    import torch.distributed as dist

    import hpc.ddp
    from hpc.trainloop import TrainLoop

    with hpc.ddp.session(timeout_s=600) as s:
        model = s.wrap(torch.nn.Linear(8, 8), strategy="ddp")
        times, barriers, cpu = [], [], []
        with TrainLoop(s, out, save_every=10**9, keep=2, tensorboard=False) as loop:
            loop.resume({"model": model})
            for step in range(1, SAVES + 2):
                loop.step = step
                s.barrier()
                t0, c0 = time.perf_counter(), time.process_time()
                loop.save(blocking=True)
                t1, c1 = time.perf_counter(), time.process_time()
                s.barrier()
                barriers.append(time.perf_counter() - t1)
                if step > 1:  # the first allocates, imports
                    times.append(t1 - t0)
                    cpu.append(c1 - c0)
        # CPU time of each rank inside the save (all its threads): what the save costs a rank,
        # which a machine with fewer cores than ranks stretches into a longer wall time
        cpus: List[float] = [0.0] * s.world_size
        dist.all_gather_object(cpus, median(cpu))
        if s.is_main:
            emit({"commit_s": median(times), "barrier_s": median(barriers[1:]), "cpu_s": cpus})


def run(ctx: Context) -> Section:
    blocks = QUICK_BLOCKS if ctx.quick else BLOCKS
    worlds = QUICK_WORLDS if ctx.quick else WORLDS
    sec = Section("scale", "Costs per rank against the world size (gloo, local processes)",
                  f"wrap+init memory <= P/W + one unit + {OVERHEAD // 2**20} MiB; bytes read at commit "
                  "and at resume <= 1.1 x the rank's share + metadata; commit latency grows no more "
                  "than a barrier's", "python -m bench --only scale" + (" --quick" if ctx.quick else ""),
                  headers=["what", "world", "rank", "measured", "bound", "detail"])
    repeated: List[str] = []
    out = ctx.scratch("scale-io")
    r = run_ranks("scale", ["--mode", "io", "--out", str(out), "--blocks", str(blocks)], out, "scale io",
                  repeated, world=WORLD_IO)
    for rank, x in enumerate(r["ranks"]):
        p, w = x["model_bytes"], WORLD_IO
        bound = p / w + x["unit_bytes"] + OVERHEAD
        sec.rows.append(["wrap + init memory", w, rank, _mib(x["grown"]), _mib(bound),
                         f"P = {_mib(p)}, P/W = {_mib(p / w)}, unit = {_mib(x['unit_bytes'])}"])
        sec.verdicts.append((f"rank {rank}: wrapping and initialising a {_mib(p)} meta model at world {w} "
                             f"grew memory by {_mib(x['grown'])}, bound {_mib(bound)}", x["grown"] <= bound))
        for when in ("commit", "resume"):
            limit = 1.1 * x["share"] + x["metadata"]
            got = x[when]
            sec.rows.append([f"bytes read at {when}", w, rank, f"rchar {_mib(got['rchar'])}, disk "
                             f"{_mib(got['read_bytes'])}", _mib(limit), f"share {_mib(x['share'])}"])
            sec.verdicts.append((f"rank {rank}: read {_mib(got['rchar'])} at {when} (read calls; "
                                 f"{_mib(got['read_bytes'])} from the disk), its share {_mib(x['share'])}",
                                 got["rchar"] <= limit))
    base, cores = None, len(os.sched_getaffinity(0))
    for w in worlds:
        out = ctx.scratch(f"scale-commit-{w}")
        c = run_ranks("scale", ["--mode", "commit", "--out", str(out)], out, f"commit at {w}", repeated, world=w)
        base = base or c
        growth, allowed = c["commit_s"] - base["commit_s"], c["barrier_s"] - base["barrier_s"]
        total = sum(c["cpu_s"])
        sec.rows.append(["commit latency", w, 0, fmt_s(c["commit_s"]), "",
                         f"barrier {fmt_s(c['barrier_s'])}; growth from world {worlds[0]}: {fmt_s(growth)}; "
                         f"CPU in the save: rank 0 {fmt_s(c['cpu_s'][0])}, all ranks {fmt_s(total)} "
                         f"({fmt_s(total / cores)} per core of {cores})"])
        sec.verdicts.append((f"world {w}: commit {fmt_s(c['commit_s'])}, barrier {fmt_s(c['barrier_s'])}; "
                             f"growth {fmt_s(growth)} against the barrier's {fmt_s(allowed)} x 4 + 50 ms; "
                             f"rank 0's own CPU time in the save {fmt_s(c['cpu_s'][0])} (world {worlds[0]}: "
                             f"{fmt_s(base['cpu_s'][0])}), the ranks' together {fmt_s(total / cores)} per core",
                             growth <= 4 * max(allowed, 0) + 0.05))
    sec.notes += [
        f"io: {WORLD_IO} ranks, a model of {blocks} Linear({WIDTH}, {WIDTH}) built on the meta device, "
        "FSDP, saved by TrainLoop through DCP without an optimizer (the checkpoint is the model); "
        "'share' = the rank's own .distcp file; metadata = DCP's .metadata, the marker, shared.pt and the "
        "rank's rank-R.pt. rchar counts every read call (page cache included), read_bytes the disk; the "
        "checkpoint's pages are dropped from the cache before the resume",
        "commit: a Linear(8, 8) under DDP, saved through DCP, 5 blocking saves after a first one; the "
        "allowance for growth is 4 barriers' growth (a save runs a few collectives: DCP's plan "
        "gather and scatter, its metadata reduce, TrainLoop's barrier) plus 50 ms of a loaded "
        "machine's noise. CPU in the save: process time (every thread) of each rank inside the save, "
        "median over the saves; where the ranks together need more CPU per core than the commit "
        "takes, the ranks outnumber the cores and the wall time measures the sharing of the cores, "
        "not the work of one rank, which is what grows with the world size on a node of one GPU per rank"] + repeated_note(repeated)
    return sec


def _mib(n: float) -> str:
    return f"{n / 2**20:.1f} MiB"


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.scale")
    p.add_argument("--mode", choices=["io", "commit"], required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--blocks", type=int, default=BLOCKS)
    a = p.parse_args()
    import torch

    torch.set_num_threads(1)
    io(a.out, a.blocks) if a.mode == "io" else commit(a.out)


if __name__ == "__main__":
    main()
