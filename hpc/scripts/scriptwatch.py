"""A hang watchdog for an unmodified script, which has no step hpc can see: its heartbeat is rank 0's
output growing (or a line matching the user's pattern).

    with ScriptWatch(hang_dir, rank, world, host, timeout_s=1800, logs=[out, err], pid=proc.pid) as watch:
        ... watch.report once rank 0 saw no progress for timeout_s and gathered every rank's stacks

Rank 0 reads the size of its task's log files (SLURM writes them; the script's prints land there),
or, with a pattern, the new bytes since the last look. Until the first progress the allowance is
`startup_s` (default the larger of timeout_s and STARTUP_S): imports, the rendezvous and data loading
take long on a loaded node, and a short --hang-after must not requeue a script that is only starting.
With no progress for `timeout_s` after that, it files a
request in the attempt's hang directory (hpc.recovery.hangs); every rank's wrapper, which lists that
directory every `poll_s`, answers with its script's stacks: py-spy's dump of every thread, native
frames included, when py-spy is installed, else the script's own faulthandler, which hpc's
sitecustomize registered for STACKS_SIGNAL (the stacks then go to that rank's log, named in the
answer). Rank 0 names the suspects, ranks whose main thread is not waiting in a collective while
others are, writes the report that python -m hpc.status shows, and the wrapper decides: a requeue
from the last checkpoint, up to max_hangs times, as TrainLoop's watchdog does.

Cost at 512 ranks: one directory listing per rank every poll_s (10 s: about 50 per second on the
shared file system), one stat of two log files per poll on rank 0; nothing on the script's path.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from hpc.recovery.hangs import HangDir

STARTUP_S = 300.0  # the least time a script has to show its first progress
# Lines the task's log gets from hpc, submitit and srun themselves (a requeued attempt appends to the
# same log): none of them is the script's progress, so none ends its start-up allowance.
OWN_LINE = re.compile(rb"^(\[hpc\]|hpc\.launch:|submitit |srun: )")
STACKS_SIGNAL = signal.SIGWINCH  # ignored by default: a script without the handler is unaffected
# A main thread in one of these is waiting for its peers (a collective, a barrier, a store, a join).
WAITING = re.compile(r"all_reduce|allreduce|all_gather|broadcast|barrier|reduce_scatter|\bwait\b|_wait|recv|"
                     r"monitored_barrier|synchronize|get\b.*store|TCPStore|join")


class ScriptWatch:
    def __init__(self, hang_dir: Path, rank: int, world_size: int, host: str, timeout_s: float,
                 logs: Sequence[Path], pid: int, pattern: Optional[str] = None, poll_s: Optional[float] = None,
                 gather_s: Optional[float] = None, startup_s: Optional[float] = None) -> None:
        self.hang = HangDir(hang_dir, rank)
        self.rank, self.world_size, self.host, self.timeout_s = rank, world_size, host, timeout_s
        self.startup_s = max(timeout_s, STARTUP_S) if startup_s is None else startup_s
        self._started = False  # rank 0's script showed progress once: timeout_s applies from then on
        self.logs, self.pid = [Path(p) for p in logs], pid
        self.pattern = re.compile(pattern.encode()) if pattern else None
        self.poll_s = poll_s or min(max(timeout_s / 10, 0.5), 10.0)
        self.gather_s = gather_s or max(3 * self.poll_s, 5.0)
        self.report: Optional[Dict[str, Any]] = None
        self.fired = threading.Event()  # rank 0 gathered the stacks: decide now
        self._sizes: List[int] = [self._size(p) for p in self.logs]
        self._last = time.monotonic()
        self._since = 0.0  # when rank 0 asked for the stacks
        self._answered = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="hpc-scriptwatch", daemon=True)

    def __enter__(self) -> "ScriptWatch":
        self.hang.introduce(self.host)
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join(timeout=self.poll_s + 5)
        if not self._answered:
            self.hang.leave()

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            try:
                self.look()
            except OSError as err:  # a full or vanished directory must not end the watch
                print(f"[hpc] script watchdog of rank {self.rank}: {err}", flush=True)

    def look(self) -> str:
        """One look: 'watching', 'fired', 'answered', 'gathering' or 'done'."""
        if self.fired.is_set():
            return "done"
        if self.rank == 0 and not self._answered:
            idle = self._idle()
            if idle > (self.timeout_s if self._started else self.startup_s):
                self.hang.request({"rank": 0, "host": self.host, "idle_s": round(idle, 1)})
                self._answer(f"no progress in rank 0's output for {idle:.0f} s")
                self._since = time.monotonic()
                return "fired"
            return "watching"
        names = self.hang.names()
        if not self._answered:
            if "request" in names:
                self._answer("asked by rank 0, whose script made no progress")
                return "answered"
            return "watching"
        if self.rank == 0:
            answers = self.hang.answers(names)
            if len(answers) >= self.world_size or time.monotonic() - self._since > self.gather_s:
                self.report = self._verdict(answers)
                self.fired.set()
                return "done"
            return "gathering"
        return "answered"

    def _idle(self) -> float:
        sizes = [self._size(p) for p in self.logs]
        grew = False
        for i, (path, size) in enumerate(zip(self.logs, sizes)):
            if size > self._sizes[i]:
                grew = grew or self._progress(path, self._sizes[i], size)
            self._sizes[i] = size
        if grew:
            self._last = time.monotonic()
            self._started = True
        return time.monotonic() - self._last

    def _progress(self, path: Path, start: int, end: int) -> bool:
        """Whether the bytes added to `path` are progress: any output once the script started (a
        stat, nothing read), else a line of the script's own; with a pattern, a line matching it."""
        if self.pattern is None and self._started:
            return True
        try:
            with open(path, "rb") as fh:
                fh.seek(max(start, end - (1 << 20)))  # the last MiB of what was added
                added = fh.read()
        except OSError:
            return False
        if self.pattern is not None:
            return bool(self.pattern.search(added))
        return any(line.strip() and not OWN_LINE.match(line) for line in added.splitlines())

    @staticmethod
    def _size(path: Path) -> int:
        try:
            return path.stat().st_size
        except OSError:
            return 0

    def _answer(self, why: str) -> None:
        self._answered = True
        stacks, where = dump_stacks(self.pid, self.logs[-1] if self.logs else None)
        header = {"rank": self.rank, "host": self.host, "pid": self.pid, "why": why, "time": time.time(),
                  "stacks": where, "suspect": suspect(stacks) if stacks else None}
        final = self.hang.path / f"rank-{self.rank}.txt"
        final.parent.mkdir(parents=True, exist_ok=True)
        part = final.with_name(final.name + ".part")
        part.write_text(json.dumps(header) + "\n" + (stacks or f"(stacks in {where})\n"))
        os.replace(part, final)

    def _verdict(self, answers: Dict[int, Dict[str, Any]]) -> Dict[str, Any]:
        silent = [r for r in range(self.world_size) if r not in answers]
        flagged = [r for r, a in sorted(answers.items()) if a.get("suspect")]
        known = [r for r, a in answers.items() if a.get("suspect") is not None]
        if silent:
            stuck, why = silent, "their wrappers did not answer (node down, or the wrapper stopped)"
        elif flagged and len(flagged) < len(known):
            stuck, why = flagged, "not waiting in a collective while the others are (py-spy stacks)"
        elif known and not flagged:
            stuck, why = [], "none: every rank waits in a collective that never completes"
        else:
            stuck, why = [], "unknown: read the stacks"
        hosts = {str(r): (answers.get(r) or {}).get("host", "?") for r in stuck}
        return {"stuck": stuck, "hosts": hosts, "why": why, "answered": sorted(answers),
                "world_size": self.world_size, "dir": str(self.hang.path), "decided_by": 0, "time": time.time(),
                "idle_s": round(time.monotonic() - self._last, 1), "last_step": None}

    def write(self, decision: Dict[str, Any]) -> Dict[str, Any]:
        """The report, with the wrapper's decision, where hpc.status reads it."""
        report = {**(self.report or {}), "decision": decision}
        self.hang.write_report(report)
        return report


def dump_stacks(pid: int, log: Optional[Path]) -> tuple:
    """(py-spy's dump of pid, 'py-spy') or, without py-spy, ('', the log) after asking the script's
    faulthandler (registered by hpc's sitecustomize) to write its stacks there."""
    spy = shutil.which("py-spy")
    if spy:
        try:
            out = subprocess.run([spy, "dump", "--pid", str(pid), "--native"], capture_output=True, text=True,
                                 timeout=60)
            if out.returncode == 0 and out.stdout.strip():
                return out.stdout, "py-spy"
        except (OSError, subprocess.TimeoutExpired):
            pass
    try:
        os.kill(pid, STACKS_SIGNAL)
    except OSError:
        pass
    return "", str(log) if log else "the rank's log"


def suspect(stacks: str) -> bool:
    """Whether a py-spy dump's main thread is not waiting for its peers (the rank the others wait for)."""
    main = stacks.split("\nThread ", 2)[1] if "\nThread " in stacks else stacks
    return not WAITING.search(main)
