"""Preemption to safe: from SIGTERM to the checkpoint durable on disk (and the stop decided), against
the time to write the same bytes with fsync at the disk bandwidth measured in the same run.

    python -m bench --only preemption

The job is bench.trainjob: hpc.ddp.session + hpc.trainloop.TrainLoop, one process, outside SLURM
(so the requeue decision is "not under SLURM" and costs no scheduler call). The parent sends SIGTERM
once the job trains; the job reports the moment TrainLoop's stop returned (checkpoint committed:
files fsync'd, renamed, directory fsync'd). The same bytes are then written and fsync'd to the same
filesystem by the parent, right before and right after each run (their mean is the comparison:
the disk of a shared machine drifts). Dirty pages left by earlier runs are flushed (sync) before
each run and each probe, so none of them pays for another's writeback.

The job's step is short and fixed (bench.trainjob.train_step: a few ms whatever the state size), as
a GPU job's is on the host: the figure is the stop itself, not a step of CPU arithmetic on 1 GB.
The step length is reported, and "SIGTERM -> step end" shows what the step in progress added.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List

from bench.common import REPO, Context, child_env, fmt_s, fsync_write_seconds, median
from bench.report import Section

SIZES_MB = (100, 1000)
QUICK_SIZES_MB = (10,)
REPEATS = 2


def preempt_once(out: Path, size_mb: int) -> Dict[str, float]:
    probe_bytes = size_mb * 2**20
    os.sync()
    write_before = fsync_write_seconds(out.parent / f"{out.name}-probe", probe_bytes)
    os.sync()
    argv = [sys.executable, "-m", "bench.trainjob", "--out", str(out), "--size-mb", str(size_mb),
            "--mode", "preempt"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=child_env(), cwd=REPO)
    try:
        line = proc.stdout.readline()
        if line.strip() != "READY":
            raise RuntimeError(f"bench.trainjob did not start training: {line!r} {proc.stderr.read()[-1500:]}")
        time.sleep(0.5)  # a few steps in
        t_signal = time.time()
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
    lines = [ln for ln in stdout.splitlines() if ln.startswith("{")]
    if not lines:
        raise RuntimeError(f"bench.trainjob gave no result after SIGTERM (exit {proc.returncode}): {stderr[-1500:]}")
    r = json.loads(lines[-1])
    step_dir = out / "checkpoints" / f"step-{r['step']}"
    if not (step_dir / "COMPLETE.json").exists():
        raise RuntimeError(f"no committed checkpoint {step_dir} after the stop")
    nbytes = sum(f.stat().st_size for f in step_dir.iterdir())
    os.sync()
    write_after = fsync_write_seconds(out / "fsync-probe", nbytes)
    return {"signal_to_safe": r["t_safe"] - t_signal, "signal_to_seen": r["t_signal_seen"] - t_signal,
            "signal_to_step_end": r["t_step_end"] - t_signal, "step_s": r["step_s"],
            "bytes": nbytes, "fsync_write": (write_before * nbytes / probe_bytes + write_after) / 2,
            "write_before": write_before * nbytes / probe_bytes, "write_after": write_after}


def run(ctx: Context) -> Section:
    sec = Section("preemption", "Preemption to safe",
                  "signal -> checkpoint durable <= 2 x fsync'd write of the same bytes + 0.5 s",
                  "python -m bench --only preemption" + (" --quick" if ctx.quick else ""),
                  headers=["state", "checkpoint bytes", "step", "SIGTERM -> handler", "SIGTERM -> step end",
                           "SIGTERM -> safe", "fsync'd write of same bytes (before / after)",
                           "bound (2x + 0.5 s)", "disk bandwidth"])
    for size in QUICK_SIZES_MB if ctx.quick else SIZES_MB:
        runs: List[Dict[str, float]] = [preempt_once(ctx.scratch(f"preempt-{size}-{i}"), size)
                                        for i in range(1 if ctx.quick else REPEATS)]
        safe = median([r["signal_to_safe"] for r in runs])
        write = median([r["fsync_write"] for r in runs])
        nbytes = runs[0]["bytes"]
        bound = 2 * write + 0.5
        med = lambda key: fmt_s(median([r[key] for r in runs]))  # noqa: E731
        sec.rows.append([f"{size} MB", f"{nbytes / 2**20:.0f} MiB", med("step_s"), med("signal_to_seen"),
                         med("signal_to_step_end"), fmt_s(safe),
                         f"{fmt_s(write)} ({med('write_before')} / {med('write_after')})", fmt_s(bound),
                         f"{nbytes / write / 2**20:.0f} MiB/s"])
        sec.verdicts.append((f"{size} MB: safe {fmt_s(safe)} after SIGTERM, bound {fmt_s(bound)}", safe <= bound))
    sec.notes += [
        f"median of {1 if ctx.quick else REPEATS} runs per size; 'safe' = TrainLoop finished its stop: the "
        "step in progress ended, the agreed stop check ran, the blocking save committed (COMPLETE.json, "
        "rename, directory fsync) and the requeue decision was made",
        "the blocking save streams the live state with torch.save while a second thread computes the "
        "crc32 of each tensor's bytes as they are written; the fsync'd write is the mean of a probe "
        "just before and one just after the run, each after a sync",
        "step = bench.trainjob's step (a 256x256 matmul and an in-place update of a strided slice of "
        "every parameter tensor); a job whose step is longer adds up to one step to 'SIGTERM -> safe'",
        "outside SLURM here, so the decision needs no scontrol call; under SLURM add one `scontrol show job` "
        "(about 10 ms on the local cluster) and, on a timeout, one `scontrol requeue`"]
    return sec
