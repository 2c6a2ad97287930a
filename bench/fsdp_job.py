"""One FSDP job at world size 2, 8 and 32 (gloo, local processes): start-up, commit latency, rank
0's own CPU in a commit, and the bytes and files each rank opens at resume.

    python -m bench --only fsdp-job [--quick]
    RANK=0 ... python -m bench.fsdp_job --out DIR --t0 $(date +%s.%N)   # one rank of a launch

Each launch is one job: every rank imports torch and hpc, opens the session, wraps BLOCKS
Linear(WIDTH, WIDTH) under FSDP with AdamW and trains one step (start-up: from the launcher's
clock just before it started the ranks to that step's end, every rank). TrainLoop then makes SAVES
blocking saves after a first one (commit latency: rank 0's wall time inside the save; rank 0's CPU:
its process CPU time inside the save, every thread). A second TrainLoop in the same processes then
resumes the newest checkpoint twice (the first imports DCP's reading modules), and the second
resume's read calls (/proc/self/io rchar) and the files it opens (Python's "open" audit event, which
every open of torch.load, DCP's reader and hpc's store raises) are the rank's.
"""
from __future__ import annotations

import argparse
import os
import re
import sys
import time
from pathlib import Path
from typing import Dict, List

from bench.common import Context, emit, fmt_mib, fmt_s, median, proc_io
from bench.ranks import rank0_result, repeated_note, start_ranks
from bench.report import Section

WIDTH, BLOCKS = 1024, 8  # 4 MiB of weights a block; with AdamW's two moments 96 MiB of state, so that
# a rank's share (3 MiB at 32 ranks) outweighs the checkpoint's small files
WORLDS, QUICK_WORLDS = (2, 8, 32), (2, 4)
SAVES, QUICK_SAVES = 5, 2
READ_BOUND = 1.25  # a rank's read at resume <= 1.25 x its share + the metadata it reads
CPU_BOUND = 1.5  # rank 0's CPU in a commit at the largest world <= 1.5 x at the smallest
SHARD = re.compile(r"__(\d+)_\d+\.distcp$")


def _objects(s):
    import torch

    torch.manual_seed(0)
    net = torch.nn.Sequential(*(torch.nn.Linear(WIDTH, WIDTH, bias=False) for _ in range(BLOCKS)))
    model = s.wrap(net, strategy="fsdp")
    return model, torch.optim.AdamW(model.parameters(), lr=0.01)


def _opened_files(rank: int, where: Path, opened: List[str]) -> Dict:
    """The checkpoint files a rank opened, by kind: its own shard file, other ranks' shard files,
    and the rest (marker, index parts, shared.pt, rank-R.pt), with the bytes of the rest."""
    inside = [Path(p).resolve() for p in opened]
    inside = [p for p in inside if p.parent == where]
    names = {p.name for p in inside}
    shards = {n: int(m.group(1)) for n in names if (m := SHARD.match(n))}
    return {"own": sum(r == rank for r in shards.values()), "other": sum(r != rank for r in shards.values()),
            "metadata": len(names) - len(shards), "opens": len(inside),
            "other_names": sorted(n for n, r in shards.items() if r != rank),
            "metadata_bytes": sum((where / n).stat().st_size for n in names if n not in shards)}


def job(out: Path, saves: int, t0_launch: float) -> None:
    import torch
    import torch.distributed as dist

    import hpc.ddp
    from hpc.trainloop import TrainLoop

    opened: List[str] = []
    recording = [False]

    def hook(event: str, args: tuple) -> None:
        if recording[0] and event == "open" and isinstance(args[0], (str, bytes, os.PathLike)):
            opened.append(os.fsdecode(args[0]))
    sys.addaudithook(hook)
    with hpc.ddp.session(timeout_s=900) as s:
        model, opt = _objects(s)
        model(torch.randn(4, WIDTH)).sum().backward()
        opt.step()
        opt.zero_grad()
        startup = time.time() - t0_launch
        s.barrier()
        wall, cpu = [], []
        with TrainLoop(s, out, save_every=10**9, keep=2, tensorboard=False) as loop:
            loop.resume({"model": model, "optimizer": opt})
            for step in range(1, saves + 2):
                loop.step = step
                s.barrier()
                t0, c0 = time.perf_counter(), time.process_time()
                loop.save(blocking=True)
                t1, c1 = time.perf_counter(), time.process_time()
                s.barrier()
                if step > 1:  # the first allocates and imports
                    wall.append(t1 - t0)
                    cpu.append(c1 - c0)
        for attempt in range(2):
            model, opt = _objects(s)
            with TrainLoop(s, out, tensorboard=False) as loop:
                opened.clear()
                before = proc_io()["rchar"]
                recording[0] = True
                step = loop.resume({"model": model, "optimizer": opt})
                recording[0] = False
                read = proc_io()["rchar"] - before
        where = (Path(out) / "checkpoints" / f"step-{step}").resolve()
        tensors = sum(p.stat().st_size for p in where.glob("*.distcp"))
        files = _opened_files(s.rank, where, opened)
        mine = {"startup_s": startup, "commit_s": median(wall), "commit_cpu_s": median(cpu), "read": read,
                "share": tensors / s.world_size, "files": files, "step": step, "metadata": files["metadata_bytes"]}
        reports: List[Dict] = [{}] * s.world_size
        dist.all_gather_object(reports, mine)
        if s.is_main:
            emit({"ranks": reports})


def run(ctx: Context) -> Section:
    worlds, saves = (QUICK_WORLDS, QUICK_SAVES) if ctx.quick else (WORLDS, SAVES)
    sec = Section("fsdp-job", "One FSDP job at world size 2, 8 and 32 (gloo, local processes)",
                  f"rank 0's CPU in a commit at {worlds[-1]} ranks <= {CPU_BOUND} x at {worlds[0]}; at resume each "
                  f"rank reads <= {READ_BOUND} x its share + the metadata it opens, and opens no other rank's "
                  "shard file",
                  "python -m bench --only fsdp-job" + (" --quick" if ctx.quick else ""),
                  headers=["world", "start-up (median / slowest rank)", "commit (rank 0)", "rank 0 CPU in a commit",
                           "read at resume (median / most)", "share", "metadata read (most)",
                           "files opened at resume (own / other ranks' shards / metadata)"])
    repeated: List[str] = []
    results: Dict[int, List[Dict]] = {}
    for world in worlds:
        out = ctx.scratch(f"fsdp-job-{world}")
        args = ["--out", str(out), "--saves", str(saves), "--t0", repr(time.time())]  # the ranks' start-up clock
        try:
            ranks = rank0_result(start_ranks("fsdp_job", args, world), f"fsdp job at {world}", timeout=1200)["ranks"]
        except RuntimeError as err:
            repeated.append(str(err)[-300:])
            continue
        results[world] = ranks
        files = [r["files"] for r in ranks]
        sec.rows.append([world, f"{fmt_s(median([r['startup_s'] for r in ranks]))} / "
                                f"{fmt_s(max(r['startup_s'] for r in ranks))}",
                         fmt_s(ranks[0]["commit_s"]), fmt_s(ranks[0]["commit_cpu_s"]),
                         f"{fmt_mib(median([r['read'] for r in ranks]))} / {fmt_mib(max(r['read'] for r in ranks))}",
                         fmt_mib(ranks[0]["share"]), fmt_mib(max(r["metadata"] for r in ranks)),
                         f"{max(f['own'] for f in files)} / {max(f['other'] for f in files)} / "
                         f"{max(f['metadata'] for f in files)}"])
        over = [i for i, r in enumerate(ranks) if r["read"] > READ_BOUND * r["share"] + r["metadata"]]
        sec.verdicts.append((f"world {world}: every rank read at most {READ_BOUND} x its share "
                             f"({fmt_mib(ranks[0]['share'])}) + the metadata it opened"
                             + (f"; over it: ranks {over[:8]}" if over else ""), not over))
        others = sorted({n for f in files for n in f["other_names"]})
        sec.verdicts.append((f"world {world}: other ranks' shard files opened at resume: "
                             f"{max(f['other'] for f in files)} per rank at most"
                             + (f" ({', '.join(others[:4])})" if others else ""), not others))
    if len(results) == len(worlds):
        small, large = results[worlds[0]][0]["commit_cpu_s"], results[worlds[-1]][0]["commit_cpu_s"]
        sec.verdicts.append((f"rank 0's CPU in a commit: {fmt_s(large)} at {worlds[-1]} ranks, {fmt_s(small)} at "
                             f"{worlds[0]}: {large / small:.2f}x", large <= CPU_BOUND * small))
    sec.notes += [
        f"model: {BLOCKS} Linear({WIDTH}, {WIDTH}) under FSDP with AdamW's state, one training step, then "
        f"{saves} blocking saves by TrainLoop (medians) and a resume by a second TrainLoop in the same processes",
        "start-up: the launcher's clock just before it starts the ranks, to the end of each rank's first step "
        "(interpreter, torch and hpc imports, the session's process group, the FSDP wrap); every rank shares this "
        "machine's cores, so the larger worlds' start-up and commit wall times mostly measure the cores shared "
        "(about 4 s of CPU per rank to import torch and DCP), not a cluster's",
        "share: every .distcp file's bytes / the world size; metadata: the bytes of the checkpoint's other files "
        "the rank opened (marker, index parts, shared.pt, rank-R.pt); files: the checkpoint's files the rank opened "
        "(Python's open audit event), the most of any rank",
    ] + repeated_note(repeated)
    return sec


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.fsdp_job")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--saves", type=int, default=SAVES)
    p.add_argument("--t0", type=float, required=True, help="the launcher's time.time() as it started the ranks")
    a = p.parse_args()
    import torch

    torch.set_num_threads(1)
    os.environ.setdefault("HPC_WATCHDOG_S", "0")
    job(a.out, a.saves, a.t0)


if __name__ == "__main__":
    main()
