"""Bytes each rank reads at a resume, by case: where "within 1.1 x its share" holds and where not.

    python -m bench --only resume-reads [--quick]
    RANK=0 ... python -m bench.resume_reads --mode save --strategy fsdp --ckpt DIR   # one rank of a launch

A model of BLOCKS Linear(WIDTH, WIDTH) with AdamW state trains a step and TrainLoop saves it through
DCP (blocking) under a strategy and world size; then TrainLoop resumes it under a strategy and world
size, and each rank's read calls (/proc/self/io rchar) during the resume are its reads. A rank's
share is the checkpoint's tensor bytes (every .distcp file) divided by the resuming world size;
metadata is DCP's .metadata, the marker, shared.pt and the rank's rank-R.pt (if the saving world had
that rank), as in bench.scale.

The cases: FSDP resumed on the world size that saved it (each rank reads its own shards: the bound
holds); FSDP resumed on another world size (DCP reads every saved chunk a rank's new shard overlaps
whole: from 2 to 4 ranks each rank reads 2 x its share); DDP (every rank loads the whole state:
world size x its share).
"""
from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Dict, List

from bench.common import Context, emit, fmt_mib, proc_io
from bench.ranks import repeated_note, run_ranks
from bench.report import Section

WIDTH, BLOCKS, QUICK_BLOCKS = 512, 16, 4  # 1 MiB of weights per block, 3 MiB with AdamW's state
BOUND = 1.1
# (label, strategy and world that saved, strategy and world that resume)
CASES = [("FSDP, same world", ("fsdp", 2), ("fsdp", 2)),
         ("FSDP, resharded 2 -> 4", ("fsdp", 2), ("fsdp", 4)),
         ("FSDP, resharded 4 -> 2", ("fsdp", 4), ("fsdp", 2)),
         ("DDP, same world", ("ddp", 2), ("ddp", 2)),
         ("DDP, same world", ("ddp", 4), ("ddp", 4))]


def _objects(s, strategy: str, blocks: int):
    import torch

    torch.manual_seed(0)
    net = torch.nn.Sequential(*(torch.nn.Linear(WIDTH, WIDTH, bias=False) for _ in range(blocks)))
    model = s.wrap(net, strategy=strategy)
    return model, torch.optim.AdamW(model.parameters(), lr=0.01)


def save(ckpt: Path, strategy: str, blocks: int) -> None:
    import torch

    import hpc.ddp
    from hpc.trainloop import TrainLoop

    with hpc.ddp.session(timeout_s=600) as s:
        model, opt = _objects(s, strategy, blocks)
        with TrainLoop(s, ckpt, save_every=10**9, tensorboard=False) as loop:
            loop.resume({"model": model, "optimizer": opt})
            for _ in loop.steps(1):
                model(torch.randn(4, WIDTH)).sum().backward()
                opt.step()
                opt.zero_grad()
        if s.is_main:
            emit({"saved": True})


def resume(ckpt: Path, strategy: str, blocks: int) -> None:
    import torch.distributed as dist

    import hpc.ddp
    from hpc.trainloop import TrainLoop

    with hpc.ddp.session(timeout_s=600) as s:
        for attempt in range(2):  # the first imports DCP's modules: their reads are no checkpoint's
            model, opt = _objects(s, strategy, blocks)
            with TrainLoop(s, ckpt, tensorboard=False) as loop:
                before = proc_io()["rchar"]
                step = loop.resume({"model": model, "optimizer": opt})
                read = proc_io()["rchar"] - before
        where = Path(ckpt) / "checkpoints" / f"step-{step}"
        tensors = sum(p.stat().st_size for p in where.glob("*.distcp"))
        metadata = sum((where / n).stat().st_size for n in (".metadata", "COMPLETE.json", "shared.pt",
                                                            f"rank-{s.rank}.pt") if (where / n).exists())
        assert step > 0, f"no checkpoint resumed from {ckpt}"  # a resume that read nothing measures nothing
        mine = {"read": read, "share": tensors / s.world_size, "metadata": metadata, "step": step}
        reports: List[Dict] = [{}] * s.world_size
        dist.all_gather_object(reports, mine)
        if s.is_main:
            emit({"ranks": reports})


def run(ctx: Context) -> Section:
    blocks = QUICK_BLOCKS if ctx.quick else BLOCKS
    sec = Section("resume-reads", "Bytes read per rank at resume, by case (gloo, local processes)",
                  f"FSDP resumed on the world size that saved it: <= {BOUND} x the rank's share + metadata; "
                  "the other cases measured against the same bound, which they are not held to",
                  "python -m bench --only resume-reads" + (" --quick" if ctx.quick else ""),
                  headers=["case", "saved by", "resumed by", "rank", "read", "share", "read / share",
                           f"within {BOUND} x share + metadata"])
    repeated: List[str] = []
    saved: Dict[tuple, Path] = {}
    for label, source, target in CASES:
        if source not in saved:
            out = saved[source] = ctx.scratch(f"resume-reads-{source[0]}{source[1]}")
            run_ranks("resume_reads", ["--mode", "save", "--strategy", source[0], "--ckpt", str(out),
                                       "--blocks", str(blocks)], out, f"save {source}", repeated, world=source[1])
        # a failed launch's retry empties the `out` given: a scratch directory, never the checkpoint
        r = run_ranks("resume_reads", ["--mode", "resume", "--strategy", target[0], "--ckpt", str(saved[source]),
                                       "--blocks", str(blocks)], ctx.scratch("resume-reads-retry"),
                      f"resume {target}", repeated, world=target[1])
        for rank, x in enumerate(r["ranks"]):
            held = x["read"] <= BOUND * x["share"] + x["metadata"]
            sec.rows.append([label, f"{source[0]} x {source[1]}", f"{target[0]} x {target[1]}", rank,
                             fmt_mib(x["read"]), fmt_mib(x["share"]), f"{x['read'] / x['share']:.2f}x",
                             "yes" if held else "no"])
            if label.startswith("FSDP, same"):
                sec.verdicts.append((f"{label}, rank {rank}: read {fmt_mib(x['read'])}, its share "
                                     f"{fmt_mib(x['share'])}, metadata {fmt_mib(x['metadata'])}", held))
    sec.notes += [
        f"model: {blocks} Linear({WIDTH}, {WIDTH}) with AdamW's state (3 tensors per block), saved by TrainLoop "
        "through DCP without collectives after one step, resumed by TrainLoop; read = rchar (every read call, "
        "page cache included) during the second of two resumes in the same processes; share = every .distcp "
        "file's bytes / the resuming world size; metadata = .metadata, the marker, shared.pt and rank-R.pt",
        "why the other cases read more: DCP reads each saved chunk a rank's new shard overlaps whole (a "
        "chunk is read and checked against its crc32 as one piece) and narrows it in memory, so from 2 "
        "ranks to 4 each rank reads the saved half its quarter lies in, 2 x its share; from 4 to 2 a "
        "rank's new shard is exactly 2 saved chunks, within the bound; under DDP every rank holds, and "
        "so reads, the whole state: world size x its share",
    ] + repeated_note(repeated)
    return sec


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.resume_reads")
    p.add_argument("--mode", choices=["save", "resume"], required=True)
    p.add_argument("--strategy", choices=["ddp", "fsdp"], required=True)
    p.add_argument("--ckpt", type=Path, required=True)
    p.add_argument("--blocks", type=int, default=BLOCKS)
    a = p.parse_args()
    import torch

    torch.set_num_threads(1)
    os.environ.setdefault("HPC_WATCHDOG_S", "0")
    (save if a.mode == "save" else resume)(a.ckpt, a.strategy, a.blocks)


if __name__ == "__main__":
    main()
