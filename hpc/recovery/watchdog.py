"""A progress watchdog per rank: when no training step completes for watchdog_s, save every rank's
stacks, name the stuck rank, and end the job, which hpc requeues from its last checkpoint.

    with TrainLoop(s, out_dir, watchdog_s=300) as loop: ...     # or HPC_WATCHDOG_S=300; 0: off

A rank stopped (SIGSTOP), or a collective that never completes, would otherwise hold every GPU of
the job until its time limit. The watchdog is a daemon thread: TrainLoop calls beat() after each
step, and the thread looks every poll_s. It watches from the first completed step of an attempt
(start-up, a checkpoint load and the first step's compilation may be long: the process group's
start-up timeout covers them), or from the start with startup_s.

When it fires (hpc.recovery.hangs has the files):
  1. it asks the other ranks for their stacks (a `request` file: a rank that has been idle for
     half its limit looks for it, so a training rank never lists the directory) and writes its
     own, every thread, with faulthandler;
  2. once every rank answered, or after gather_s, the first rank to claim the verdict names the
     stuck ranks (no answer, or behind the others) with their hosts, asks SLURM to requeue the job
     (hpc.recovery.preemption: SLURM's verdict first, then the hang count against max_hangs), and writes
     report.json;
  3. every rank that took part ends its process: exit status 0 when the job was requeued, 1
     otherwise (srun --kill-on-bad-exit then ends the step). A stopped rank is killed by SLURM.
A rank whose main thread raises meanwhile (a peer's exit breaks the collective it waits in)
waits for the verdict instead (wait_for_end): the job is requeued, not failed.

watchdog_s must be longer than the slowest step, a periodic checkpoint save included, and shorter
than the training collective timeout (hpc.ddp.session's train_timeout_s, else timeout_s): a
collective that times out first raises, and the job fails without stacks or requeue.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from dataclasses import asdict
from typing import Any, Callable

from hpc.fs.atomic import write_bytes
from hpc.recovery import preemption
from hpc.recovery.hangs import IN_PLACE, REPORT, HangDir, attempt_dir, describe, verdict

log = logging.getLogger(__name__)
DEFAULT_WATCHDOG_S = 300.0


def configured(watchdog_s: float | None) -> float | None:
    """The watchdog time: the argument, else HPC_WATCHDOG_S, else DEFAULT_WATCHDOG_S; None when 0."""
    if watchdog_s is None:
        text = os.environ.get("HPC_WATCHDOG_S", "").strip()
        try:
            watchdog_s = float(text) if text else DEFAULT_WATCHDOG_S
        except ValueError:
            raise ValueError(f"HPC_WATCHDOG_S={text!r}; expected seconds, a number. "
                             "HINT: HPC_WATCHDOG_S=300, or 0 to turn the watchdog off") from None
    if watchdog_s < 0:
        raise ValueError(f"watchdog_s={watchdog_s}; expected seconds >= 0. HINT: 0 turns the watchdog off")
    return float(watchdog_s) or None


class Watchdog:
    """See the module docstring. `decide(report)` returns the requeue decision as a dict
    ({"requeue": bool, "why": str}); `exit` ends the process (os._exit; a recorder in tests)."""

    def __init__(self, directory: Any, rank: int, world_size: int, host: str, timeout_s: float,
                 decide: Callable[[dict], dict], startup_s: float | None = None,
                 poll_s: float | None = None, gather_s: float | None = None,
                 clock: Callable[[], float] = time.monotonic, exit: Callable[[int], Any] = os._exit,
                 extra_dump: Callable[[Any], Any] | None = None) -> None:
        self.hang, self.world_size, self.host = HangDir(directory, rank), world_size, host
        self.timeout_s, self.startup_s, self.decide = timeout_s, startup_s, decide
        self.poll_s = poll_s or min(max(timeout_s / 10, 0.2), 10.0)
        self.gather_s = gather_s or max(3 * self.poll_s, min(timeout_s / 4, 30.0), 2.0)  # a rank its load delayed still answers
        self.clock, self.exit, self.extra_dump = clock, exit, extra_dump
        self.step: int | None = None  # last completed step
        self._last, self._beats, self._resting = clock(), 0, False
        self._since: float | None = None  # when this rank fired, or answered a request
        self._fired = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def involved(self) -> bool:
        return self._since is not None

    def start(self) -> "Watchdog":
        self.hang.introduce(self.host)
        self._last = self.clock()
        self._thread = threading.Thread(target=self._run, name="hpc-watchdog", daemon=True)
        self._thread.start()
        return self

    def beat(self, step: int) -> None:
        """A step completed (cheap: no lock, no system call)."""
        self.step, self._beats, self._resting, self._last = step, self._beats + 1, False, self.clock()

    def rest(self) -> None:
        """After the last step: nothing to watch until the next beat, startup_s or not."""
        self._beats, self._resting = 0, True

    def stop(self) -> None:
        """Stop watching (the loop ended, or stops for a signal); a normal exit cleans up."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=self.poll_s + 5)
        if not self.involved:
            self.hang.leave()

    def wait_for_end(self) -> None:
        """In the main thread, after an exception during a hang: let the watchdog end the process."""
        deadline = self.clock() + self.gather_s + self.timeout_s + 2 * self.poll_s
        while self.involved and self.clock() < deadline:
            time.sleep(self.poll_s)

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            try:
                self.check()
            except Exception as err:  # a full or vanished directory must not kill the thread
                log.warning("watchdog of rank %d: %s: %s", self.hang.rank, type(err).__name__, err)

    def check(self) -> str:
        """One look: 'off', 'watching', 'fired', 'asked', 'gathering' or 'ended'."""
        now = self.clock()
        if self._since is None:
            limit = self.timeout_s if self._beats else None if self._resting else self.startup_s
            idle = now - self._last
            if limit is None:
                return "off"
            if idle > limit:
                self._fired = True
                self.hang.request({"rank": self.hang.rank, "host": self.host, "step": self.step})
                self._answer(now, idle, f"no step completed for {idle:.1f} s")
                return "fired"
            if idle > limit / 2 and "request" in self.hang.names():
                self._answer(now, idle, "asked by the rank whose watchdog fired")
                return "asked"
            return "watching"
        names = self.hang.names()
        if REPORT in names:
            self._end(self.hang.report())
            return "ended"
        answers = self.hang.answers(names)
        waited = now - self._since
        if self._fired and (len(answers) >= self.world_size or waited > self.gather_s) and self.hang.claim():
            self._end(self._report(answers, now))
            return "ended"
        if waited > self.gather_s + self.timeout_s:  # the rank that claimed the verdict never wrote it
            self._end(None)
            return "ended"
        return "gathering"

    def _answer(self, now: float, idle: float, why: str) -> None:
        self._since = now
        log.error("watchdog of rank %d on %s: %s (last step %s); stacks go to %s", self.hang.rank,
                  self.host, why, self.step, self.hang.path)
        if self.extra_dump is not None:
            try:
                self.extra_dump(self.hang.path)
            except Exception as err:
                log.warning("watchdog: the extra dump failed: %s", err)
        self.hang.dump({"rank": self.hang.rank, "host": self.host, "pid": os.getpid(), "step": self.step,
                        "idle_s": round(idle, 1), "why": why, "time": time.time()})

    def _report(self, answers: dict, now: float) -> dict:
        report = verdict(self.world_size, answers, self.hang.identities())
        report.update(dir=str(self.hang.path), decided_by=self.hang.rank, time=time.time(),
                      idle_s=round(now - self._last, 1), last_step=self.step)
        try:
            report["decision"] = dict(self.decide(report))
        except Exception as err:  # the verdict is written whatever happens to the requeue
            report["decision"] = {"requeue": False, "why": f"{type(err).__name__}: {err}"}
        self.hang.write_report(report)
        return report

    def _end(self, report: dict | None) -> None:
        requeued = bool(report and (report.get("decision") or {}).get("requeue"))
        if report and report.get("decided_by") == self.hang.rank:
            log.error("hang: %s", describe(report))
        in_place = bool(report and (report.get("decision") or {}).get("by") == IN_PLACE)
        log.error("watchdog of rank %d: ending the process (%s)", self.hang.rank, "the job is requeued" if requeued
                  else "the step is restarted in place" if in_place else "not requeued")
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        self.exit(0 if requeued else 1)


def for_loop(loop: Any, watchdog_s: float | None = None) -> Watchdog | None:
    """The watchdog of a TrainLoop: its verdict asks SLURM, as a stop does, and records the hang in
    the store's requeue history (hpc.recovery.preemption), which caps the requeues at max_hangs."""
    def decide(report: dict) -> dict:
        request = preemption.StopRequest("hang")
        return asdict(preemption.handle_stop(request, loop.store.directory / "requeue.json",
                                             max_timeouts=loop.max_timeouts))

    return for_session(loop.s, loop.out_dir, decide, watchdog_s)


def for_session(session: Any, out_dir: Any, decide: Callable[[dict], dict],
                watchdog_s: float | None = None, startup_s: float | None = None) -> Watchdog | None:
    """The started watchdog of one rank of `session`, meeting the others under out_dir/hangs;
    None when it is turned off."""
    timeout_s = configured(watchdog_s)
    if timeout_s is None:
        return None
    env = session.env
    collective = getattr(session, "train_timeout_s", None)
    if session.is_main and collective and timeout_s >= collective:
        log.warning("watchdog_s=%g is not below the collective timeout (%g s): a hung collective fails "
                    "the job before the watchdog saves the stacks and requeues it. HINT: lower "
                    "watchdog_s or raise train_timeout_s of hpc.ddp.session", timeout_s, collective)
    host = env.hosts[env.node_rank] if env.hosts else os.uname().nodename
    dump = nccl_trace if session.device.type == "cuda" else None
    return Watchdog(attempt_dir(out_dir, env.job_id, env.restart_count), env.rank, env.world_size, host,
                    timeout_s, decide, startup_s=startup_s, extra_dump=dump).start()


def nccl_trace(directory: Any) -> None:
    """NCCL's flight recorder of this rank as the watchdog fires (CUDA): the watchdog ends the job
    before NCCL's own timeout would dump it."""
    import torch
    import torch.distributed as dist

    dump = getattr(torch._C._distributed_c10d, "_dump_nccl_trace", None)
    if dump is not None and dist.is_initialized():
        write_bytes(os.path.join(directory, "nccl", f"rank-{dist.get_rank()}.watchdog"), dump())
