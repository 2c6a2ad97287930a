"""Where a training step's time goes: rank 0 of one benchmark launch under py-spy, one arm only,
summarised as text into bench/profiles/ (the command that made it on the first line).

    python -m bench.profile ddp hpc            # hpc.ddp.session's step -> bench/profiles/ddp-hpc.txt
    python -m bench.profile save hpc           # TrainLoop with checkpoints
    python -m bench.profile fsdp torch         # hand-written FSDP2
    python -m bench.profile save-cpu           # a TrainLoop save's CPU per phase (bench.save_cpu)
    python -m bench.profile --list

py-spy samples rank 0's Python stacks (`--idle`: waiting in a collective counts too) while it
trains `blocks` x `block-steps` steps of one arm (bench.interleave's `--only`). The summary keeps
the samples under the step function: the share of step time in each function (inclusive, then
self), and the stacks themselves folded without line numbers, largest first (a flame graph's
input, readable as text).
"""
from __future__ import annotations

import argparse
import collections
import io
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Dict, List, Tuple

from bench.common import REPO
from bench.ranks import rank0_result, start_ranks

# name -> (benchmark module, its --pair)
TARGETS = {"ddp": ("ddp_overhead", "session"), "save": ("ddp_overhead", "save"),
           "fsdp": ("fsdp_step", "hpc"), "fsdp-trainloop": ("fsdp_step", "trainloop")}
ROOT = "stepper.<locals>.step"  # bench.ddp_overhead.stepper: one training step
RATE = 250  # samples per second


def fold(raw: str) -> Tuple[Dict[str, int], int]:
    """py-spy's raw output -> stacks from ROOT down, without line numbers -> samples; and the total."""
    stacks: Dict[str, int] = collections.Counter()
    for line in raw.splitlines():
        if not line.strip() or " " not in line:
            continue
        stack, n = line.rsplit(" ", 1)
        frames = [re.sub(r":\d+\)$", ")", f) for f in stack.split(";")]
        names = [f.split(" (")[0] for f in frames]
        if ROOT in names:
            stacks[";".join(frames[names.index(ROOT):])] += int(n)
    return stacks, sum(stacks.values())


def summary(stacks: Dict[str, int], total: int, steps: int, top: int = 30) -> List[str]:
    incl: Dict[str, int] = collections.Counter()
    own: Dict[str, int] = collections.Counter()
    for stack, n in stacks.items():
        frames = stack.split(";")
        for f in set(frames):
            incl[f] += n
        own[frames[-1]] += n
    ms = 1000 / RATE / max(steps, 1)
    out = [f"# {total} samples under {ROOT} over {steps} steps: {total * ms:.1f} ms per step", "",
           "## inclusive: share of step time, ms per step, function"]
    out += [f"{100 * n / total:6.1f}%  {n * ms:7.2f} ms  {f}" for f, n in incl.most_common(top)]
    out += ["", "## self"]
    out += [f"{100 * n / total:6.1f}%  {n * ms:7.2f} ms  {f}" for f, n in own.most_common(top)]
    out += ["", "## folded stacks (largest first; samples at the end)"]
    out += [f"{s} {n}" for s, n in sorted(stacks.items(), key=lambda kv: -kv[1]) if n * 1000 >= total]
    return out


def profile(target: str, arm: str, blocks: int, size: int) -> Path:
    module, pair = TARGETS[target]
    spy = shutil.which("py-spy")
    if spy is None:
        raise SystemExit("py-spy not found; expected it on PATH. HINT: pip install py-spy")
    command = f"python -m bench.profile {target} {arm} --blocks {blocks} --block-steps {size}"
    with tempfile.TemporaryDirectory(prefix="hpc-profile-") as tmp:
        raw = Path(tmp) / "raw.txt"
        args = ["--pair", pair, "--only", arm, "--blocks", str(blocks), "--block-steps", str(size), "--out", tmp]
        rank0_result(start_ranks(module, args, rank0_prefix=[spy, "record", "--idle", "-r", str(RATE),
                                                             "--format", "raw", "-o", str(raw), "--"]),
                     f"profile of {target} {arm}")
        stacks, total = fold(raw.read_text())
    load = open("/proc/loadavg").read().split()[:3]
    out = REPO / "bench" / "profiles" / f"{target}-{arm}.txt"
    out.parent.mkdir(exist_ok=True)
    head = [f"# command: {command}",
            f"# rank 0 under: py-spy record --idle -r {RATE} --format raw (bench.{module} --pair {pair} "
            f"--only {arm}); load average after: {' '.join(load)}"]
    out.write_text("\n".join(head + summary(stacks, total, blocks * size)) + "\n")
    return out


SUBMIT = ["-m", "hpc.submit", "langsplat", "--levels", "0", "1", "2", "--profile", "sandbox"]


def profile_submission(real: bool) -> Path:
    """The whole submission command: `-X importtime` (imports, cumulative, largest first) and
    cProfile (cumulative time, largest first). `real` submits (SLURM_CONF must name a cluster)."""
    import pstats

    from bench.submission import bench_env

    name = "submission-real" if real else "submission-dry-run"
    with tempfile.TemporaryDirectory(prefix="hpc-profile-") as tmp:
        # as bench.submission measures: from this checkout (which the real one snapshots), after a warm-up run
        env = bench_env(dict(os.environ), Path(tmp))
        argv = [*SUBMIT, "--run-dir", f"{tmp}/run-warm"] + ([] if real else ["--dry-run"])
        subprocess.run([sys.executable, *argv], capture_output=True, text=True, cwd=REPO, check=True, env=env)
        argv[argv.index("--run-dir") + 1] = f"{tmp}/run-imports"
        imports = subprocess.run([sys.executable, "-X", "importtime", *argv], capture_output=True, text=True,
                                 cwd=REPO, check=True, env=env).stderr
        argv[argv.index("--run-dir") + 1] = f"{tmp}/run"
        prof = f"{tmp}/run.prof"
        subprocess.run([sys.executable, "-m", "cProfile", "-o", prof, *argv], capture_output=True, text=True,
                       cwd=REPO, check=True, env=env)
        stats = io.StringIO()
        pstats.Stats(prof, stream=stats).sort_stats("cumulative").print_stats(40)
    rows = [ln.split("|") for ln in imports.splitlines() if ln.startswith("import time:") and "|" in ln]
    rows = [(int(r[1]), r[2].rstrip()) for r in rows[1:] if r[1].strip().isdigit()]
    load = open("/proc/loadavg").read().split()[:3]
    out = REPO / "bench" / "profiles" / f"{name}.txt"
    head = [f"# command: python -m bench.profile {'submission-real' if real else 'submission'}",
            f"# profiles `python {' '.join(argv)}` (a temporary run directory, after one warm-up run that "
            "writes the bytecode and hpc's user cache: bench.submission.bench_env); load average after: "
            f"{' '.join(load)}", "", "## python -X importtime: cumulative us, module (top 25)"]
    head += [f"{us:8d}  {mod}" for us, mod in sorted(rows, reverse=True)[:25]]
    head += ["", "## cProfile, cumulative (profiling slows Python calls: read the shares, not the seconds)"]
    out.write_text("\n".join(head) + "\n" + stats.getvalue())
    return out


def profile_save_cpu() -> Path:
    """bench.save_cpu on 2 ranks: rank 0's CPU per save in each phase of a TrainLoop save."""
    from bench import save_cpu

    with tempfile.TemporaryDirectory(prefix="hpc-profile-") as tmp:
        result = rank0_result(start_ranks("save_cpu", [tmp]), "profile of a TrainLoop save's CPU")
    load = open("/proc/loadavg").read().split()[:3]
    out = REPO / "bench" / "profiles" / "save-cpu.txt"
    head = ["# command: python -m bench.profile save-cpu",
            f"# bench.save_cpu on 2 gloo ranks (time.thread_time around each phase); load average after: {' '.join(load)}"]
    out.write_text("\n".join(head + save_cpu.summary(result)) + "\n")
    return out


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.profile")
    p.add_argument("target", nargs="?", choices=sorted(TARGETS) + ["submission", "submission-real", "save-cpu"])
    p.add_argument("arm", nargs="?", choices=("torch", "hpc"), default="hpc")
    p.add_argument("--blocks", type=int, default=10)
    p.add_argument("--block-steps", type=int, default=40)
    p.add_argument("--list", action="store_true")
    a = p.parse_args()
    if a.list or a.target is None:
        print("\n".join(f"{k:15s} bench.{m} --pair {pair}" for k, (m, pair) in TARGETS.items()))
        return
    if a.target == "save-cpu":
        print(profile_save_cpu())
        return
    if a.target.startswith("submission"):
        print(profile_submission(real=a.target == "submission-real"))
        return
    print(profile(a.target, a.arm, a.blocks, a.block_steps))


if __name__ == "__main__":
    sys.exit(main())
