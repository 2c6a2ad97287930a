"""Run the benchmarks and write BENCHMARKS.md at the repository root.

    python -m bench                              # everything (several minutes)
    python -m bench --only checkpoint status     # some of them; the others' sections are kept
    python -m bench --quick                      # smaller sizes: a smoke test, not figures to keep
    python -m bench --list

The fault campaigns are apart, in the faults package: python -m faults.reliability writes RELIABILITY.md.

A benchmark that cannot run (a module missing, no SLURM here) is reported as "not measured" with
the reason; the others still run. The sections are also saved as JSON next to the report
(BENCHMARKS.json): a run with --only replaces those sections and keeps the others as they were.
"""
from __future__ import annotations

import argparse
import importlib
import sys
import time
import traceback
from pathlib import Path
from typing import List, Optional, Sequence

from bench.common import REPO, Context
from bench.report import Section, load, machine, render, save, stamp

# name -> (module, title, target): the order of the report.
BENCHMARKS = {
    "submission": ("bench.submission", "Submission wall time",
                   "a real submission within 0.5 s and at most 1.25x plain submitit's CPU; a dry run within 0.3 s"),
    "checkpoint": ("bench.checkpoint_stall", "Checkpoint stall per save",
                   "training blocked per background save <= 10% of a synchronous torch.save"),
    "preemption": ("bench.preempt_safe", "Preemption to safe",
                   "signal -> checkpoint durable <= 2 x fsync'd write of the same bytes + 0.5 s"),
    "resume": ("bench.resume", "Resume: job start to first step", "resuming <= 1.2 x a fresh start"),
    "ddp": ("bench.ddp_overhead", "DDP overhead (gloo, 2 ranks)",
            "hpc session step time <= 1.02 x hand-written torch DDP; TrainLoop with checkpoints <= 1.02 x "
            "hand-written with torch.save on rank 0"),
    "fsdp": ("bench.fsdp_step", "FSDP step time (gloo, 2 ranks)",
             "hpc FSDP step time <= 1.02 x hand-written FSDP2 (median)"),
    "fsdp-checkpoint": ("bench.fsdp_checkpoint",
                        "FSDP checkpoint stall and preemption to safe, beside DDP (gloo, 2 ranks)",
                        "training blocked per asynchronous save <= 10% of a blocking save; "
                        "SIGTERM -> checkpoint committed <= 2 x fsync'd write of the same bytes + 0.5 s"),
    "scale": ("bench.scale", "Costs per rank against the world size (gloo, local processes)",
              "wrap+init memory <= P/W + one unit + 64 MiB; bytes read at commit and at resume (FSDP, the "
              "world size that saved) <= 1.1 x the rank's share + metadata; commit latency grows no more "
              "than a barrier's"),
    "rank-costs": ("bench.rank_costs", "One rank's work at resume and rank 0's commit, at 64 and 512 ranks",
                   "filesystem calls of one rank's resume at 512 ranks <= 1.25 x at 64; rank 0's commit "
                   "at 512 ranks <= 1 s"),
    "fsdp-job": ("bench.fsdp_job", "One FSDP job at world size 2, 8 and 32 (gloo, local processes)",
                 "rank 0's CPU in a commit at 32 ranks <= 1.5 x at 2; at resume each rank reads <= 1.25 x its "
                 "share + the metadata it opens, and opens no other rank's shard file"),
    "resume-reads": ("bench.resume_reads", "Bytes read per rank at resume, by case (gloo, local processes)",
                     "FSDP resumed on the world size that saved it: <= 1.1 x the rank's share + metadata; "
                     "the other cases measured against the same bound, which they are not held to"),
    "sweep": ("bench.sweep", "Sweep submission: 10, 100, 1000 points, 2 stages",
              "a 100-point sweep submitted within 2 s, the 1000-point one within 2 s of CPU (1 ms per point), "
              "one sbatch per stage (and per item of a point waiting on its point's task) per MaxArraySize "
              "chunk, hpc.status on it within 2 s"),
    "per-step": ("bench.per_step", "Per-step costs hpc adds (gloo, 2 and 8 ranks)",
                 "each per-step collective and host call listed with its cost; none a blocking device-to-host sync"),
    "status": ("bench.status_calls", "Status: scheduler calls per poll",
               "one scheduler call per poll, whatever the job count; 10,000 tasks within 2 s"),
    "remote": ("bench.remote", "Submission to a named cluster over ssh",
               "remote submission within local submission + one ssh round trip + the laptop's side + 0.1 s; an "
               "unchanged tree pushes 0 bytes of code; one round trip per status poll, whatever the task count"),
    "task-startup": ("bench.task_startup", "A task's start-up CPU and hpc's share",
                     "hpc's share of a task's start-up (batch step and task step) within 60 ms"),
    "langsplat": ("bench.langsplat_cams", "LangSplat stage 2 throughput", "cameras per second at 1 and 2 ranks"),
    "software-record": ("bench.software_record",
                        "Recording an attempt: software record and attempts.json; a notification",
                        "at most 50 ms of CPU per attempt on rank 0, no collective"),
    "nodecheck": ("bench.nodecheck", "Node check before training: cost per node",
                  "a builtin check's step within 1 s wall and 100 ms CPU per node"),
    "restart": ("bench.restart", "Restart in place against a requeue: failure to first step",
                "a restart in place reaches its first step after the failure before a requeue does, and within "
                "1.3 x a requeue without its queue wait, with no more scheduler calls"),
    "packing": ("bench.packing", "Packing: 64 one-GPU items on 8-GPU nodes, whole nodes allocated",
                "pack=8: 8 jobs and 8 node-hours, against 64 of each unpacked"),
}
MOVED = {"reliability": "python -m faults.reliability"}  # not benchmarks: they count losses, not time


def run_one(name: str, ctx: Context, command: str) -> Section:
    module, title, target = BENCHMARKS[name]
    measured_at = stamp(time.time(), machine())
    t0 = time.perf_counter()
    try:
        section = importlib.import_module(module).run(ctx)
    except Exception as err:  # one broken piece must not hide the others' figures
        traceback.print_exc()
        reason = str(err).strip().splitlines()[-1] if str(err).strip() else type(err).__name__
        section = Section(name, title, target, command, not_measured=f"{type(err).__name__}: {reason}")
    section.seconds = time.perf_counter() - t0
    section.measured_at = measured_at
    return section


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench", description="measure what users pay for")
    p.add_argument("--only", nargs="+", metavar="NAME", help=f"some of: {' '.join(BENCHMARKS)}")
    p.add_argument("--quick", action="store_true", help="smaller sizes, for a smoke test")
    p.add_argument("--out", help=f"report path (default: {REPO / 'BENCHMARKS.md'}; with --quick "
                   f"{REPO / 'BENCHMARKS-quick.md'}, so a smoke test never replaces real figures)")
    p.add_argument("--keep", action="store_true", help="keep the scratch directory (and cluster files)")
    p.add_argument("--cluster-dir", help="use (and leave up) this local cluster instead of a fresh one")
    p.add_argument("--launches", type=int, metavar="N",
                   help="launches per pair of the fsdp section (default 16): more narrow its intervals")
    p.add_argument("--list", action="store_true", help="list the benchmarks and exit")
    args = p.parse_args(argv)
    if args.list:
        print("\n".join(f"{k:12s} {v[1]}: {v[2]}" for k, v in BENCHMARKS.items()))
        return 0
    names: List[str] = args.only or list(BENCHMARKS)
    unknown = [n for n in names if n not in BENCHMARKS]
    if unknown:
        moved = [MOVED[n] for n in unknown if n in MOVED]
        p.error(f"unknown benchmark(s) {unknown}; expected some of {list(BENCHMARKS)}. "
                f"HINT: {' and '.join(moved) or 'python -m bench --list'}")
    command = "python -m bench" + (f" --only {' '.join(names)}" if args.only else "") + \
        (" --quick" if args.quick else "") + (f" --launches {args.launches}" if args.launches else "")
    started, info = time.time(), machine()
    out = Path(args.out or REPO / ("BENCHMARKS-quick.md" if args.quick else "BENCHMARKS.md"))
    # --quick figures are a smoke test: they never replace kept ones, nor are kept themselves
    earlier = load(out.with_suffix(".json")) if args.only and not args.quick else {}
    sections = {}
    if args.launches is not None and args.launches < 2:
        p.error(f"--launches {args.launches}; expected 2 or more. HINT: the interval resamples launches.")
    with Context(quick=args.quick, keep=args.keep, cluster_dir=args.cluster_dir, launches=args.launches) as ctx:
        for name in names:
            print(f"[bench] {name} ...", file=sys.stderr, flush=True)
            s = run_one(name, ctx, command)
            print(f"[bench] {name}: {s.outcome} ({s.seconds:.0f} s)", file=sys.stderr, flush=True)
            sections[name] = s
    kept = tuple(n for n in earlier if n not in sections and n in BENCHMARKS)
    ordered = [sections.get(n) or earlier[n] for n in BENCHMARKS if n in sections or n in kept]
    out.write_text(render(ordered, command, started, info, kept))
    if not args.quick:
        save(ordered, out.with_suffix(".json"))
    print(f"wrote {out}" + (f" (kept from earlier runs: {', '.join(kept)})" if kept else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
