"""Each attempt of a task as rank 0 saw it: the software it ran on, when training began, each checkpoint's
step and stall, how it ended. One small file per task, written by rank 0 only, where it already writes.

    python -c "from hpc.rundir import attempts; print(attempts.load('runs/x/train'))"

<task>/attempts.json holds {"attempts": [...]}, one entry per (job id, restart), oldest first. hpc's
training loop (hpc.trainloop) writes its entry when it resumes, at each checkpoint (the first step's
time goes in with the first one) and at its stop or end; a `run` stage's wrapper (hpc.scripts.runner)
when the script starts and when it ends. No collective: the other ranks hold an AttemptLog that
does nothing. hpc.monitor.goodput reads these entries beside SLURM's attempts to split the
allocation; hpc.status shows a resume onto different software (hpc.rundir.software.differences).
`resume.same_software: require` makes the resume refuse it (refusal()).
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Tuple

from hpc.fs import atomic
from hpc.rundir import software

ATTEMPTS = "attempts.json"
KEEP_SAVES = 8  # a resume continues from one of the newest checkpoints: older saves keep only their sum
POLICIES = ("warn", "require")
POLICY_ENV = "HPC_SAME_SOFTWARE"


class SoftwareChanged(RuntimeError):
    """A resume onto different software under resume.same_software=require."""


def load(task_dir: Path) -> List[Dict[str, Any]]:
    try:
        data = json.loads((Path(task_dir) / ATTEMPTS).read_text())
    except (OSError, ValueError):
        return []
    found = data.get("attempts") if isinstance(data, dict) else None
    return [a for a in found if isinstance(a, dict)] if isinstance(found, list) else []


def find(task_dir: Path) -> List[Dict[str, Any]]:
    """The task's entries: <task>/attempts.json, else the first found up to two folders down (a loop
    whose out_dir is a subfolder of the task's)."""
    found = load(task_dir)
    for level in ("*", "*/*") if not found else ():
        for path in sorted(Path(task_dir).glob(f"{level}/{ATTEMPTS}")):
            return load(path.parent)
    return found


def process_start() -> Optional[float]:
    """When this process started (Linux /proc), epoch seconds; None elsewhere."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        boot = next(float(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines()
                    if line.startswith("btime"))
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return None


def checkpoints_seen(task_dir: Path, depth: int = 3) -> List[List[float]]:
    """[step, time committed] of the newest KEEP_SAVES committed step-N/ checkpoints under the task
    directory (their COMPLETE.json markers): what a `run` script's attempt saved, seen from outside."""
    found = []
    for level in range(depth):
        for marker in Path(task_dir).glob("/".join(["*"] * level + ["step-*", "COMPLETE.json"])):
            step = marker.parent.name[len("step-"):]
            try:
                found.append([int(step), marker.stat().st_mtime, 0.0]) if step.isdigit() else None
            except OSError:
                continue
    return sorted(found)[-KEEP_SAVES:]


def software_change(entries: List[Mapping[str, Any]]) -> str:
    """hpc.status's line: each attempt whose software differs from the one before it, or ''."""
    said = []
    for n in range(1, len(entries)):
        before, now = entries[n - 1].get("software"), entries[n].get("software")
        if isinstance(before, dict) and isinstance(now, dict):
            changed = software.differences(before, now)
            if changed:
                said.append(f"attempt {n + 1} (job {entries[n].get('job')}) ran on different software: "
                            f"{', '.join(changed)}; not a bitwise resume")
    return "; ".join(said)


def refusal(entries: List[Mapping[str, Any]], now: Mapping[str, Any], policy: str, where: str) -> str:
    """The one-line refusal of a resume onto software that differs from the one that wrote the
    newest checkpoint's attempt, under policy 'require'; '' otherwise."""
    wrote = next((a for a in reversed(entries) if a.get("saves") and isinstance(a.get("software"), dict)), None)
    if policy != "require" or wrote is None:
        return ""
    changed = software.differences(wrote["software"], now)
    if not changed:
        return ""
    return (f"resume of {where} onto different software ({', '.join(changed)}); expected the software of job "
            f"{wrote.get('job')} that wrote its checkpoints (resume.same_software=require). HINT: run it where "
            "that software is, or resubmit with resume.same_software=warn to resume anyway (not bitwise)")


def run_of(task_dir: Path) -> Tuple[Optional[Path], Dict[str, Any]]:
    """The run directory a task directory is in (it or up to two folders above: a loop's out_dir may be
    a subfolder of the task's) and its config.yaml as plain data; (None, {}) outside a run."""
    for folder in list(Path(task_dir).resolve().parents)[:3]:
        # a sweep's point may run before its manifest is written: its sweep's record says it is a run
        if (folder / "config.yaml").exists() and ((folder / "manifest.json").exists() or
                                                  (folder.parent / "sweep.json").exists()):
            import yaml  # only a task inside a run directory reads its config

            try:
                cfg = yaml.safe_load((folder / "config.yaml").read_text())
            except (OSError, ValueError, yaml.YAMLError):
                cfg = None
            return folder, cfg if isinstance(cfg, dict) else {}
    return None, {}


def policy(task_dir: Path, environ: Mapping[str, str] = os.environ) -> str:
    """resume.same_software of the task's run: $HPC_SAME_SOFTWARE, else the run's config.yaml, else 'warn'."""
    if environ.get(POLICY_ENV) in POLICIES:
        return environ[POLICY_ENV]
    value = (run_of(task_dir)[1].get("resume") or {}).get("same_software", "warn")
    return value if value in POLICIES else "warn"


class AttemptLog:
    """Rank 0's entry for this attempt in <task>/attempts.json; every method does nothing when
    `main` is False (the other ranks)."""

    def __init__(self, task_dir: Path, main: bool, job: str, restart: int, kind: str = "loop"):
        self.path, self.main = Path(task_dir) / ATTEMPTS, main
        self.entry: Dict[str, Any] = {"job": str(job), "restart": int(restart), "kind": kind}
        self._stall = 0.0

    @classmethod
    def here(cls, task_dir: Path, main: bool, kind: str = "loop",
             environ: Mapping[str, str] = os.environ) -> "AttemptLog":
        """This process's attempt: its job as the run's manifest names it (an array task as
        ARRAY_TASK), SLURM's restart count."""
        array, task = environ.get("SLURM_ARRAY_JOB_ID"), environ.get("SLURM_ARRAY_TASK_ID")
        job = f"{array}_{task}" if array and task else (
            environ.get("SLURM_JOB_ID") or environ.get("SUBMITIT_LOCAL_JOB_ID") or "local")
        restarts = environ.get("SLURM_RESTART_COUNT", "0")
        return cls(task_dir, main, job, int(restarts) if restarts.isdigit() else 0, kind)

    @property
    def stall_s(self) -> float:
        """Seconds the checkpoints have held the loop so far in this attempt."""
        return self._stall

    @property
    def begun(self) -> bool:
        return "began" in self.entry

    def begin(self, resumed: int = 0, soft: Optional[Mapping[str, Any]] = None) -> List[Dict[str, Any]]:
        """Record the start (the process's and now), the software and the step resumed from; the
        earlier attempts' entries, as they were, come back."""
        if not self.main:
            return []
        earlier = [a for a in load(self.path.parent)
                   if (a.get("job"), a.get("restart")) != (self.entry["job"], self.entry["restart"])]
        rec = dict(soft) if soft is not None else software.record()
        self.entry.update(process_start=process_start(), began=time.time(), resumed=int(resumed),
                          software=rec, software_digest=software.digest(rec), saves=[], stall_s=0.0)
        self._write(earlier)
        return earlier

    def resumed(self, step: int) -> None:
        """The step this attempt continues after, once its checkpoint has loaded: an earlier attempt's
        steps past it were redone (hpc.monitor.goodput)."""
        if self.main:
            self.entry["resumed"] = int(step)
            self._write()

    def start(self, resumed: int = 0) -> None:
        """begin() once, then refuse a resume onto software other than the checkpoints' when the
        task's run says resume.same_software=require (SoftwareChanged, one line)."""
        if not self.main or self.begun:
            return
        earlier = self.begin(resumed)
        refused = refusal(earlier, self.entry["software"], policy(self.path.parent), str(self.path.parent))
        if refused:
            self.ended("refused")
            raise SoftwareChanged(refused)

    def first_step(self) -> None:
        if self.main and "first_step" not in self.entry:
            self.entry["first_step"] = time.time()  # written with the next save, stop or end

    def saved(self, step: int, stall_s: float) -> None:
        """A checkpoint of `step` whose save held the loop for `stall_s` seconds."""
        if not self.main:
            return
        self._stall += stall_s
        saves = self.entry.setdefault("saves", [])
        saves.append([int(step), time.time(), round(self._stall, 4)])
        del saves[:-KEEP_SAVES]
        self.entry.update(stall_s=round(self._stall, 4), step=int(step))
        self._write()

    def ended(self, how: str, step: Optional[int] = None, stall_s: float = 0.0, **more: Any) -> None:
        """The attempt's end: 'completed', 'stopped' (a stop: preemption, time limit, hang) or 'failed'."""
        if not self.main or "end" in self.entry:
            return
        self._stall += stall_s
        self.entry.update(ended=time.time(), end=how, stall_s=round(self._stall, 4), **more)
        if step is not None:
            self.entry["step"] = int(step)
        self._write()

    def _write(self, earlier: Optional[List[Dict[str, Any]]] = None) -> None:
        if earlier is None:
            earlier = [a for a in load(self.path.parent)
                       if (a.get("job"), a.get("restart")) != (self.entry["job"], self.entry["restart"])]
        try:
            atomic.write_text(self.path, json.dumps({"attempts": [*earlier, self.entry]}), durable=False)
        except OSError:  # a record is worth less than the training it would stop
            pass
