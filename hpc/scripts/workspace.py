"""Where a user's script runs: its task's working directory, laid out once per attempt.

    work = prepare(ctx)      # <task>/work: rank 0 lays it out, the other ranks wait until it has

The script's working directory is <run>/<stage>/[task-<item>/]work (hpc.rundir.workdir): the
same for every attempt, requeue and resubmission, never inside the code snapshot, so relative
outputs (lightning_logs/, HF's output_dir, nanoGPT's out/, torchtitan's ./outputs, wandb/) are
found again by the next attempt, and a sweep's points, each with its own task directory, never
share them. Rank 0 relinks it to the snapshot this attempt runs and writes READY_FILE for the
attempt; the other ranks start their scripts once it names their attempt.
"""
from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

from hpc.fs import atomic
from hpc.recovery import hangs
from hpc.rundir import logdirs, workdir
from hpc.scripts import resume, scriptwatch

WORK = "work"
READY_FILE = "workdir.json"  # in the task directory: the attempt whose layout is in place
WAIT_S = 600.0  # how long a rank waits for rank 0's layout before it gives up, saying why


def code_dirs() -> tuple:
    """(the snapshot's copy of the submit directory or None, the live submit directory), as the
    task's StageTask left them: it moved into the snapshot's copy and exported HPC_SUBMIT_DIR."""
    here = os.getcwd()
    code = os.environ.get("HPC_CODE_DIR")
    inside = code is not None and (here == code or here.startswith(code.rstrip(os.sep) + os.sep))
    return (Path(here) if inside else None), Path(os.environ.get("HPC_SUBMIT_DIR") or here)


def attempt_of(ctx: Any) -> Dict[str, str]:
    return {"job": str(ctx.env.job_id), "restart": str(ctx.env.restart_count)}


def prepare(ctx: Any, resume_if: str = "", poll_s: float = 0.5) -> Tuple[Path, Dict[str, Any]]:
    """(the task's working directory, rank 0's resume plan: hpc.scripts.resume.plan, {} without
    --resume-if), laid out for this attempt by rank 0; the other ranks wait until it has."""
    work = Path(ctx.stage_dir) / WORK
    ready = Path(ctx.stage_dir) / READY_FILE
    attempt = attempt_of(ctx)
    if ctx.env.rank == 0:
        code, live = code_dirs()
        started = time.perf_counter()
        done = workdir.lay_out(work, code, live, never=[ctx.run_dir])
        plan = resume.plan(resume.expand([resume_if], placeholders(ctx, work))[0], work, Path(ctx.stage_dir),
                           attempt) if resume_if else {}
        atomic.write_text(ready, json.dumps({**attempt, "code": str(code) if code else None, "live": str(live),
                                             "code_links": done.code_links, "data_links": done.data_links,
                                             "kept": done.kept, "seconds": round(time.perf_counter() - started, 3),
                                             "resume": plan}))
        return work, plan
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        try:
            saved = json.loads(ready.read_text())
        except (FileNotFoundError, ValueError):
            saved = {}
        if saved.get("job") == attempt["job"] and saved.get("restart") == attempt["restart"]:
            return work, saved.get("resume") or {}
        time.sleep(poll_s)
    raise RuntimeError(f"rank {ctx.env.rank}: rank 0 did not lay out {work} for job {attempt['job']} restart "
                       f"{attempt['restart']} within {WAIT_S:.0f}s ({ready} names another attempt or is missing). "
                       "HINT: read rank 0's log (python -m hpc.logs RUN --rank 0)")


def placeholders(ctx: Any, work: Path, last: str = "") -> Dict[str, str]:
    """The values of hpc.scripts.resume.PLACEHOLDERS for this task."""
    return {"HPC_RUN_DIR": str(ctx.run_dir), "HPC_WORK_DIR": str(work),
            "HPC_CHECKPOINT_DIR": str(Path(ctx.stage_dir) / "checkpoints"), "HPC_LAST_CHECKPOINT": last}


def map_paths(argv: List[str], work: Path, live: Path, code: Optional[Path]) -> List[str]:
    """Absolute paths into the live submit directory, in the command, become the working
    directory's (so a snapshot file, not the live one, runs): `python /home/me/proj/train.py`."""
    if code is None:
        return list(argv)
    live_real = os.path.realpath(live)
    out = []
    for arg in argv:
        if os.path.isabs(arg):
            real = os.path.realpath(arg)
            if real.startswith(live_real + os.sep) and os.path.lexists(work / os.path.relpath(real, live_real)):
                arg = str(work / os.path.relpath(real, live_real))
        out.append(arg)
    return out



def log_files(ctx: Any, rank: int = 0) -> List[Path]:
    """A rank's task logs, as submitit names them: <stage>/logs/<job>/<job>_<rank>_log.{out,err}
    (an array task's job is <array id>_<index>, in its array's folder: hpc.rundir.logdirs)."""
    array, index = os.environ.get("SLURM_ARRAY_JOB_ID"), os.environ.get("SLURM_ARRAY_TASK_ID")
    job = f"{array}_{index}" if array and index else str(ctx.env.job_id)
    folder = logdirs.folder(Path(ctx.run_dir) / ctx.stage / "logs", job)
    return [folder / f"{job}_{rank}_log.{stream}" for stream in ("out", "err")]


def watch_factory(ctx: Any, script: Mapping[str, Any]) -> Optional[Callable[[int], Any]]:
    """The hang watchdog of this task's script (hpc.scripts.scriptwatch), or None when it is off."""
    timeout = float(script.get("hang_after_s", 0) or 0)
    if timeout <= 0:
        return None
    hang_dir = hangs.attempt_dir(ctx.stage_dir, ctx.env.job_id, ctx.env.restart_count)
    host = socket.gethostname().split(".")[0]
    return lambda pid: scriptwatch.ScriptWatch(hang_dir, ctx.env.rank, ctx.env.world_size, host, timeout,
                                               log_files(ctx), pid, script.get("heartbeat") or None)
