"""An unmodified script as one task of a job: started under hpc.launch, told of the time limit in
the signal it expects, and followed by one stop decision for all ranks.

    run_argv(ctx, ["python", "train.py"], max_timeouts=3, cwd=work_dir, warn="TERM")

SLURM signals every process of the step: the script gets a preemption's SIGTERM itself (and may
checkpoint). This wrapper passes the time-limit warning on (hpc.recovery.scriptproc), then decides
once the script has exited, or at the deadline (hpc.recovery.deadline) whatever the script is doing.
Rank 0 decides; under hpc's srun wrapper the host requeues (hpc.recovery.hostact), without it rank 0
does; the other ranks act on its decision (DECISION_FILE). The deadline comes from the job's EndTime,
which under the wrapper the host reads for rank 0 (hpc.recovery.hostact.ask_end): no SLURM client in
the task. Until it is known, it falls back to half of deadline.FALLBACK_WINDOW_S after the signal.
"""
from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, List, Mapping, Optional

from hpc.fs import atomic
from hpc.recovery import deadline, hostact, preemption, scriptproc, verdict
from hpc.rundir import attempts, notify
from hpc.scripts import scriptexit
from hpc.slurm import scheduler

# Rank 0's stop decision for the attempt that wrote it, in the task's checkpoint directory.
DECISION_FILE = "stop-decision.json"


def run_argv(ctx: Any, argv: List[str], max_timeouts: int, launch: bool = True,
             cwd: Optional[Path] = None, env: Optional[Mapping[str, str]] = None, warn: str = "none",
             preempt_as: Optional[str] = None, watch: Optional[Callable[[int], Any]] = None) -> dict:
    """Run argv (no shell) in this task, under `python -m hpc.launch --` for torchrun-style
    variables (launch=False: `--no-env`, the signal set-up only), in `cwd` (default: this
    process's) with `env` added to the script's environment; this process's own stay as they are.
    `warn`: how the script hears of the time limit (hpc.recovery.scriptproc); `preempt_as`: the
    signal a preemption is passed on as, to a script started with SIGTERM blocked. `watch(pid)`: a
    hang watchdog for the script (hpc.scripts.scriptwatch), whose verdict rank 0 acts on."""
    from hpc.recovery.stopsignal import StopFlag  # signal handling: only in the task that runs the script

    checkpoints = ctx.stage_dir / "checkpoints"
    checkpoints.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, **(env or {}), "HPC_CHECKPOINT_DIR": str(checkpoints), "HPC_RUN_DIR": str(ctx.run_dir)}
    cmd = [sys.executable, "-m", "hpc.launch", *([] if launch else ["--no-env"]),
           *(["--keep-timeout-signal"] if warn == "USR2" else []),
           *(["--block-term"] if preempt_as else []), "--", *argv]
    # SLURM signals every process of the step: the script gets SIGTERM itself (and may checkpoint);
    # this wrapper passes the time-limit warning on, then decides once the script has exited, or
    # at the deadline (hpc.recovery.deadline) whatever the script is doing.
    # rank 0's record of this attempt (hpc.rundir.attempts); under resume.same_software=require a
    # resume onto other software than the checkpoints' is refused here, before the script starts
    record = attempts.AttemptLog.here(ctx.stage_dir, ctx.env.rank == 0, "run")
    seen = attempts.checkpoints_seen(ctx.stage_dir) if record.main else []
    record.start(seen[-1][0] if seen else 0)  # the script resumes from the newest committed step-N/, if any
    with StopFlag() as flag, tempfile.TemporaryDirectory(prefix="hpc-exit-") as exits:
        timeout_signal = next(num for num, kind in flag.kinds.items() if kind == "timeout")
        env[scriptexit.ENV] = exits  # where the script's interpreter records a clean exit
        proc = scriptproc.start(cmd, env, cwd and str(cwd), held=timeout_signal)
        record.first_step()  # seen from outside: the script's start (its own start-up counts as running)
        attempt = {"job": str(ctx.env.job_id), "restart": str(ctx.env.restart_count)}
        stop_now = (_deadline_passed(flag) if ctx.env.rank == 0 else
                    _every(1.0, lambda: _decided(checkpoints / DECISION_FILE, attempt)))
        with (watch(proc.pid) if watch else contextlib.nullcontext()) as watcher:
            hung = watcher.fired.is_set if watcher is not None and ctx.env.rank == 0 else None
            outcome = scriptproc.supervise(proc, flag, warn, stop_now, preempt_as=preempt_as, interrupt=hung)
            if outcome == "exited":  # a crash in its teardown after a clean exit is no failure
                code = scriptexit.status(proc.returncode, exits, proc.pid, ctx.env.rank)
                if _killed_by_stop_signal(code, flag):
                    _await_own_signal(flag)
                decision = agree_on_stop(ctx, flag, checkpoints, max_timeouts)
            else:  # the script outlived the deadline, or hung: decide first, the time is SLURM's
                why = "hung" if outcome == "interrupted" else "still running at the stop deadline"
                print(f"[hpc] rank {ctx.env.rank}: the script is {why}; deciding now and ending it",
                      file=sys.stderr, flush=True)
                if outcome == "interrupted":
                    flag.reason = "hang"
                decision = agree_on_stop(ctx, flag, checkpoints, max_timeouts)
                if outcome == "interrupted":
                    watcher.write(asdict(decision) if decision else {"requeue": False, "why": "no decision"})
                code = scriptproc.end_tree(proc)
    if record.main:  # the run's sinks hear of a requeue or a time-limit cap (hpc.rundir.notify)
        notify.stop(ctx.stage_dir, decision, notify.task_key(ctx.stage_dir), ctx.env.job_id, ctx.env.restart_count)
    saves = attempts.checkpoints_seen(ctx.stage_dir)
    # no step of its own: what the script ran after its newest checkpoint is unknown, so counted as redone
    record.ended("stopped" if decision is not None else "completed" if code == 0 else "failed", saves=saves)
    if decision is not None:
        preemption.exit_for(decision)
    if code != 0:
        raise RuntimeError(f"command {cmd} exited with status {code} on rank {ctx.env.rank}")
    return {"exit_code": code}


def _deadline_passed(flag: Any) -> Any:
    """Rank 0's deadline test: learns when the job will be ended at the first stop, and again at a
    preemption after the time-limit warning (SLURM then moves EndTime to PreemptTime + GraceTime,
    often sooner than the limit). Under hpc's srun wrapper the host tells it (hpc.recovery.hostact.ask_end;
    a container has no scontrol), and until its answer has come the fallback deadline holds; without
    the wrapper it asks SLURM."""
    host = os.environ.get(hostact.ENV)
    # the stop the deadline is for (its signal's time), the deadline, whether the host's answer is
    # awaited, and the latest deadline that an EndTime from SLURM gave: SLURM only ever moves EndTime
    # earlier in an attempt (a preemption: PreemptTime + GraceTime), so no later stop goes past it
    state: dict = {"for": None, "by": 0.0, "waiting": False, "bound": float("inf")}
    answer: List[Mapping[str, str]] = [{}]  # the host's fields, kept from the read that found them

    def heard() -> bool:
        answer[0] = hostact.end_fields(host, _token(state["for"])) if host else {}
        return bool(answer[0])
    told = _every(hostact.POLL_S / 2, heard)

    def settle(fields: Mapping[str, str], received: float) -> None:
        state["by"] = min(state["bound"], deadline.decide_by(fields, received))
        if deadline.end_time(fields) is not None:
            state["bound"] = state["by"]

    def passed() -> bool:
        received = flag.received_at or state["for"] or time.time()
        if state["for"] != received:  # the first stop, or a preemption that outranked the warning
            state["for"] = received
            if host:
                hostact.ask_end(host, _token(received))
                fields: Mapping[str, str] = {}
            else:
                fields = preemption.job_info(scheduler.running_job(), preemption.shielded(
                    subprocess.run), tries=1) if os.environ.get("SLURM_JOB_ID") else {}
            settle(fields, received)
            state["waiting"] = bool(host)
        elif state["waiting"] and told():  # the host's answer: once per stop
            settle(answer[0], received)
            state["waiting"] = False
        return time.time() >= state["by"]
    return passed


def _token(received: Any) -> str:
    """The name of rank 0's question for the EndTime at the stop received then (hostact.ask_end)."""
    return f"{received:.6f}"


def _every(period_s: float, check: Callable[[], bool]) -> Callable[[], bool]:
    """`check`, asked at most once a period: every rank but 0 reads rank 0's decision file while it
    waits, so at 512 ranks a 0.1 s poll would be 5000 reads a second of one file on the shared disk."""
    last = [0.0]

    def throttled() -> bool:
        now = time.monotonic()
        if now - last[0] < period_s:
            return False
        last[0] = now
        return check()
    return throttled


def _decided(path: Path, attempt: dict) -> bool:
    try:
        saved = json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        return False
    return saved.get("job") == attempt["job"] and saved.get("restart") == attempt["restart"]


def _killed_by_stop_signal(code: int, flag: Any) -> bool:
    """Did the script die of a signal that also means a stop for this wrapper?"""
    signum = -code if code < 0 else code - 128 if code > 128 else 0
    return signum in flag.kinds


def _await_own_signal(flag: Any, timeout_s: float = 5.0) -> None:
    """SLURM signals the step's processes one by one: the script may die of its SIGTERM before this
    wrapper's own copy has arrived and run its handler. Give it a moment rather than mistake a
    preemption for a failure (the sleep is cut short by the signal, and the handler runs)."""
    deadline = time.monotonic() + timeout_s
    while flag.reason is None and time.monotonic() < deadline:
        time.sleep(0.05)


def agree_on_stop(ctx: Any, flag: Any, checkpoints: Path, max_timeouts: int) -> Any:
    """The stop decision every rank acts on, or None when rank 0 saw no stop.

    Rank 0 decides and has the job requeued (a job that ends within GraceTime is not requeued by
    SLURM 22.05; hpc.recovery.preemption.handle_stop), then writes its decision for this attempt to DECISION_FILE, always, even after a
    plain end. Other ranks that saw a stop wait for that file: leaving first, with an error,
    would let `--kill-on-bad-exit` end rank 0 before its scontrol calls return. They wait with no
    deadline of their own: rank 0's requeue ends the step, and so does rank 0 dying.
    """
    attempt = {"job": str(ctx.env.job_id), "restart": str(ctx.env.restart_count)}
    path = checkpoints / DECISION_FILE
    if ctx.env.rank != 0:
        return wait_for_decision(path, attempt) if flag.reason else None
    decision, error = None, None
    try:
        if flag.reason:
            decision = preemption.handle_stop(flag.local(), history=checkpoints / "requeue.json",
                                              max_timeouts=max_timeouts)
    except Exception as err:
        error = err
        decision = verdict.Decision(False, None, f"rank 0 could not decide: {err}", "failed")
    atomic.write_text(path, json.dumps({**attempt, "decision": decision and asdict(decision)}))
    if error is not None:
        raise error
    return decision


def wait_for_decision(path: Path, attempt: dict, poll_s: float = 0.2,
                      say_every_s: float = 60.0) -> Any:
    """Rank 0's decision for this attempt (an older attempt's file is not it), once it exists."""
    started = last_said = time.monotonic()
    while True:
        try:
            saved = json.loads(path.read_text())
        except (FileNotFoundError, ValueError):
            saved = {}
        if saved.get("job") == attempt["job"] and saved.get("restart") == attempt["restart"]:
            found = saved.get("decision")
            return verdict.Decision(**found) if found else None
        if time.monotonic() - last_said >= say_every_s:
            last_said = time.monotonic()
            print(f"[hpc] waiting {last_said - started:.0f}s for rank 0's stop decision in {path}",
                  file=sys.stderr, flush=True)
        time.sleep(poll_s)
