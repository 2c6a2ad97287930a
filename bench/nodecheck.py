"""The node check's cost per node before a stage's ranks start (hpc.recovery.nodecheck): wall and CPU.

    python -m bench --only nodecheck

Two parts, side by side with what any step costs anyway:
- one node's probe as a node runs it (`python -m hpc.recovery.nodecheckprobe`, a fresh interpreter),
  CPU (user+sys) and wall, the smallest of TRIES, beside `python -c pass`: hpc's builtin check of 2
  GPU device files (a gres.conf in the scratch directory, as the sandbox's fake GPUs) and the CPU;
  the same with a site command (`true`); and with a 4 MB gloo all_reduce across two such processes
  (each imports torch: the collective's price).
- the whole check step on the local cluster, as the batch script's wrapper sees it: the wall of
  check_before_step over 2 nodes inside one job, and each node's CPU from sacct's TotalCPU of the
  hpc-nodecheck steps, beside a bare `srun --ntasks-per-node=1 true` step in the same job.
"""
from __future__ import annotations

import json
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Tuple

from bench.common import Context, child_env, fmt_s, median
from bench.report import Section

TRIES, QUICK_TRIES = 7, 3
STEPS, QUICK_STEPS = 5, 2
TARGET_WALL_S, TARGET_CPU_S = 1.0, 0.1  # a builtin check: the step's wall, a node's CPU
JOB = """
import json, os, subprocess, sys, time
sys.path.insert(0, {repo!r})
from hpc.recovery import nodecheck
from hpc.slurm import hostlist
nodes = hostlist.expand(os.environ["SLURM_JOB_NODELIST"])
walls, bare = [], []
for k in range({steps}):
    t0 = time.perf_counter()
    subprocess.run(["srun", "--nodes=2", "--ntasks=2", "--ntasks-per-node=1", "true"], check=True)
    bare.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    healthy, failed = nodecheck.check_before_step({run!r}, nodes, {{"enabled": True}}, os.environ)
    walls.append(time.perf_counter() - t0)
    assert not failed, failed
print("RESULT " + json.dumps({{"check": walls, "bare": bare}}))
"""


def _child(argv: List[str], env: Dict[str, str]) -> Tuple[float, float]:
    """(wall, CPU user+sys) of one child process."""
    before, t0 = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    subprocess.run(argv, env=env, check=True, capture_output=True)
    wall, after = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime


def _pair(options: dict, env: Dict[str, str], job: int) -> Tuple[float, float]:
    """Two probes joined by the collective, as two nodes: (wall of both, CPU per process)."""
    before, t0 = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    procs = [subprocess.Popen([sys.executable, "-m", "hpc.recovery.nodecheckprobe", json.dumps(options)],
                              env={**env, "SLURM_PROCID": str(r), "SLURM_NTASKS": "2", "SLURM_JOB_ID": str(job),
                                   "SLURM_STEP_NODELIST": "localhost", "SLURMD_NODENAME": f"n{r + 1}"},
                              stdout=subprocess.PIPE, text=True) for r in (0, 1)]
    outs = [p.communicate()[0] for p in procs]
    wall, after = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_CHILDREN)
    assert all('"ok": true' in out for out in outs), outs
    return wall, (after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime) / 2


def probes(ctx: Context, sec: Section, tries: int) -> float:
    """One node's probe, each variant; returns the builtin check's CPU."""
    where = ctx.scratch("nodecheck")
    (where / "dev").mkdir(exist_ok=True)
    for node in ("n1", "n2"):  # n2: the collective's second process
        for i in range(2):
            (where / "dev" / f"{node}-gpu{i}").write_text("")
    (where / "gres.conf").write_text("".join(f"NodeName={n} Name=gpu File={where}/dev/{n}-gpu[0-1]\n"
                                             for n in ("n1", "n2")))
    env = child_env({"SLURM_CONF": str(where / "slurm.conf"), "SLURMD_NODENAME": "n1", "SLURM_JOB_GPUS": "0,1"})
    probe = [sys.executable, "-m", "hpc.recovery.nodecheckprobe"]
    _child([*probe, "{}"], env)  # byte code cached, as in an installed package
    python = min(_child([sys.executable, "-c", "pass"], env) for _ in range(tries))
    rows = [("python -c pass (any step's interpreter)", python)]
    for what, options in (("builtin: 2 GPU device files, CPU", {}),
                          ("builtin + site command `true`", {"command": "true"})):
        rows.append((what, min((_child([*probe, json.dumps(options)], env) for _ in range(tries)),
                               key=lambda x: x[1])))
    pairs = [_pair({"collective": True, "collective_mb": 4, "timeout_s": 60}, env, 4200 + k)
             for k in range(max(2, tries // 3))]
    rows.append(("builtin + 4 MB gloo all_reduce, 2 processes", min(pairs, key=lambda x: x[1])))
    for what, (wall, cpu) in rows:
        sec.rows.append(["one node's probe", what, fmt_s(wall), fmt_s(cpu), f"{cpu / python[1]:.1f}x CPU"])
    return rows[1][1][1]


def step(ctx: Context, sec: Section, steps: int) -> float:
    """The whole check step over 2 nodes in one job; returns its median wall."""
    cluster = ctx.cluster()
    where = ctx.scratch("nodecheck-job")
    script = where / "job.py"
    script.write_text(JOB.format(repo=str(Path(__file__).resolve().parents[1]), steps=steps, run=str(where / "run")))
    env = ctx.slurm_env()
    out = subprocess.run(["sbatch", "--wait", "--parsable", "--nodes=2", "--ntasks-per-node=1", "--cpus-per-task=1",
                          "-o", str(where / "job.out"), "--wrap", f"{sys.executable} {script}"],
                         env=env, capture_output=True, text=True, check=True)
    job = out.stdout.strip().split(";")[0]
    result = next(json.loads(line[7:]) for line in (where / "job.out").read_text().splitlines()
                  if line.startswith("RESULT "))
    cpu = _step_cpu(cluster, job, env)
    check, bare = median(result["check"]), median(result["bare"])
    sec.rows.append(["check step, 2 nodes", "bare `srun true` step", fmt_s(bare), "", "1.0x wall"])
    sec.rows.append(["check step, 2 nodes", "builtin check (check_before_step, record written)", fmt_s(check),
                     fmt_s(cpu) + " per node" if cpu is not None else "sacct gave none", f"{check / bare:.1f}x wall"])
    return check


def _step_cpu(cluster, job: str, env: Dict[str, str]) -> float | None:
    """Median TotalCPU of the job's hpc-nodecheck steps per node (sacct), None without accounting."""
    for _ in range(20):
        out = subprocess.run(["sacct", "-j", job, "-n", "-P", "-o", "JobName,TotalCPU"], env=env,
                             capture_output=True, text=True)
        rows = [line.split("|") for line in out.stdout.splitlines() if line.startswith("hpc-nodecheck|")]
        if out.returncode == 0 and rows:
            return median([_seconds(r[1]) / 2 for r in rows])
        time.sleep(0.5)
    return None


def _seconds(text: str) -> float:
    """sacct's [DD-][HH:]MM:SS[.mmm] in seconds."""
    days, _, clock = text.rpartition("-")
    parts = [float(p) for p in clock.split(":")]
    while len(parts) < 3:
        parts.insert(0, 0.0)
    return (int(days) if days else 0) * 86400 + parts[0] * 3600 + parts[1] * 60 + parts[2]


def run(ctx: Context) -> Section:
    sec = Section("nodecheck", "Node check before training: cost per node",
                  f"a builtin check's step within {TARGET_WALL_S:g} s wall and {TARGET_CPU_S * 1000:g} ms CPU per node",
                  "python -m bench --only nodecheck" + (" --quick" if ctx.quick else ""),
                  headers=["part", "what", "wall", "CPU", "against python -c pass (probe) / a bare step"])
    cpu = probes(ctx, sec, QUICK_TRIES if ctx.quick else TRIES)
    wall = step(ctx, sec, QUICK_STEPS if ctx.quick else STEPS)
    sec.verdicts += [(f"builtin check's step {fmt_s(wall)} <= {TARGET_WALL_S:g} s", wall <= TARGET_WALL_S),
                     (f"one node's builtin probe {fmt_s(cpu)} CPU <= {TARGET_CPU_S * 1000:g} ms", cpu <= TARGET_CPU_S)]
    sec.notes.append("The check runs once per step (a job's start, each restart in place), never per training step. "
                     "The collective's extra cost is torch's import on each node; it is off unless asked for "
                     "(stages.X.node_check.collective). On a GPU node the builtin check also imports torch and "
                     "runs a 256x256 matmul per GPU: not measured here (no GPU on this machine).")
    return sec
