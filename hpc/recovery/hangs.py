"""What a hang leaves in the run directory, and which rank it names as stuck.

    python -m hpc.status RUN_DIR       # "train hang: rank 3 on node2 did not answer ..." under the table

hpc.recovery.watchdog writes, per job attempt, into ``<task dir>/hangs/<job id>.<restart>/``::

    rank-R.json    who rank R is (host, pid): written when its watchdog starts, removed on a normal exit
    request        the first rank whose watchdog fired: every other rank dumps its stacks too
    rank-R.txt     rank R's Python stacks, every thread (faulthandler), under a one-line JSON header
    claim          the rank that decides, made with O_EXCL (one winner, on NFS too)
    report.json    the verdict: stuck ranks and their hosts, the ranks that answered, the requeue
    nccl/          NCCL's flight recorder, one file per rank, when a collective timed out (CUDA)

A stuck rank is one that did not answer (stopped, or in native code that holds the GIL), or else
one whose last completed step is behind the others'. Every file is polled by listing the directory
(hpc.fs.sharedfs.listed), never by stat() of a missing name. Imports no torch: hpc.status reads it.
"""

from __future__ import annotations

import faulthandler
import json
import os
import time
from pathlib import Path
from typing import Any, Mapping

from hpc.fs.atomic import unlink_quietly, write_bytes
from hpc.fs.sharedfs import listed
from hpc.recovery import inplace

HANGS = "hangs"
REPORT = "report.json"
IN_PLACE = "in place"  # who carries out a hang's decision restarted in place (the report's decision.by)


def attempt_dir(out_dir: str | os.PathLike, job_id: Any, restart: Any,
                environ: Mapping[str, str] = os.environ) -> Path:
    """Where the watchdogs of one job attempt meet (every rank computes the same path): a step
    restarted in place (hpc.recovery.inplace, named in `environ`) is an attempt of its own."""
    return Path(out_dir) / HANGS / f"{job_id or 'local'}.{restart}{inplace.tag(environ)}"


def flight_recorder_env(dump_dir: str | os.PathLike | None, entries: int = 20000) -> dict[str, str]:
    """NCCL flight recorder settings (torchtitan's CommConfig does the same): keep the last `entries`
    collectives per rank and dump them into `dump_dir`/nccl/ (made here) when one times out; without
    a directory, where torch puts them. Both names of each variable: TORCH_FR_* is what torch reads
    now, TORCH_NCCL_* what it read before. Asynchronous error handling 3 tears the process down
    without cleaning up the communicators first, the mode that lets the dump finish."""
    env = {"TORCH_FR_BUFFER_SIZE": str(entries), "TORCH_NCCL_TRACE_BUFFER_SIZE": str(entries),
           "TORCH_NCCL_DUMP_ON_TIMEOUT": "1", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "3"}
    if dump_dir is not None:
        (Path(dump_dir) / "nccl").mkdir(parents=True, exist_ok=True)
        prefix = str(Path(dump_dir) / "nccl" / "rank-")  # torch appends the rank
        env.update(TORCH_FR_DUMP_TEMP_FILE=prefix, TORCH_NCCL_DEBUG_INFO_TEMP_FILE=prefix)
    return env


class HangDir:
    """One rank's view of an attempt's hang directory."""

    def __init__(self, path: str | os.PathLike, rank: int) -> None:
        self.path, self.rank = Path(path), rank

    def introduce(self, host: str) -> None:
        write_bytes(self.path / f"rank-{self.rank}.json",
                    json.dumps({"rank": self.rank, "host": host, "pid": os.getpid()}).encode(), sync_dir=False)

    def leave(self) -> None:
        """A normal exit: forget this rank, and the directories once nothing else is in them."""
        unlink_quietly(self.path / f"rank-{self.rank}.json")
        for d in (self.path / "nccl", self.path, self.path.parent):
            try:
                d.rmdir()
            except FileNotFoundError:
                continue
            except OSError:  # not empty: other ranks, or what a hang left
                return

    def names(self) -> set[str]:
        return listed(self.path)

    def request(self, header: dict[str, Any]) -> bool:
        """Ask every rank for its stacks; True for the rank whose request came first."""
        return _create(self.path / "request", header)

    def dump(self, header: dict[str, Any]) -> None:
        """This rank's stacks, every thread, after a header line; renamed into place when complete."""
        final = self.path / f"rank-{self.rank}.txt"
        part = final.with_name(final.name + ".part")
        self.path.mkdir(parents=True, exist_ok=True)  # the last rank to leave may have removed it
        with open(part, "w") as fh:
            fh.write(json.dumps(header) + "\n")
            fh.flush()
            faulthandler.dump_traceback(fh, all_threads=True)
        os.replace(part, final)

    def answers(self, names: set[str] | None = None) -> dict[int, dict[str, Any]]:
        """rank -> header of its stacks file, for every rank that dumped."""
        names = self.names() if names is None else names
        found = {}
        for name in names:
            if name.startswith("rank-") and name.endswith(".txt"):
                with open(self.path / name) as fh:
                    found[int(name[5:-4])] = json.loads(fh.readline())
        return found

    def identities(self) -> dict[int, dict[str, Any]]:
        found = {}
        for name in self.names():
            if name.startswith("rank-") and name.endswith(".json"):
                info = _read_json(self.path / name)
                if isinstance(info, dict) and isinstance(info.get("rank"), int):
                    found[info["rank"]] = info
        return found

    def claim(self) -> bool:
        return _create(self.path / "claim", {"rank": self.rank, "time": time.time()})

    def write_report(self, report: dict[str, Any]) -> None:
        write_bytes(self.path / REPORT, json.dumps(report, indent=1).encode())

    def report(self) -> dict[str, Any] | None:
        return _read_json(self.path / REPORT) if REPORT in self.names() else None


def _create(path: Path, content: dict[str, Any]) -> bool:
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as fh:
        fh.write(json.dumps(content))
    return True


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def verdict(world_size: int, answers: dict[int, dict[str, Any]],
            identities: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """Which ranks are stuck, with their hosts, from the ranks' answers (their stack headers)."""
    silent = [r for r in range(world_size) if r not in answers]
    if silent:
        stuck, why = silent, "did not answer (stopped, or in native code holding the GIL)"
    else:
        steps = {r: a.get("step") for r, a in answers.items()}
        lowest = min((s for s in steps.values() if s is not None), default=None)
        behind = [r for r, s in sorted(steps.items()) if s is None or (lowest is not None and s == lowest)]
        if len(behind) < world_size:
            stuck, why = behind, f"is behind the others (last step {lowest})"
        else:
            stuck, why = [], f"none: every rank waits after step {lowest} (a collective that never completes)"
    hosts = {r: (answers.get(r) or identities.get(r) or {}).get("host", "?") for r in stuck}
    return {"stuck": stuck, "hosts": {str(r): h for r, h in hosts.items()}, "why": why,
            "answered": sorted(answers), "world_size": world_size}


def describe(report: dict[str, Any]) -> str:
    """One line: the stuck ranks and their hosts, why, where the stacks are, what was done."""
    hosts = report.get("hosts") or {}
    who = ", ".join(f"rank {r} on {hosts.get(str(r), '?')}" for r in report.get("stuck") or [])
    decision = report.get("decision") or {}
    after = "requeued" if decision.get("requeue") else "restarted in place" if decision.get("by") == IN_PLACE \
        else f"not requeued ({decision.get('why', '?')})"
    idle = "no step" if report.get("last_step") is not None else "no progress"  # a user's script has no steps
    return (f"{who or 'stuck rank:'} {report.get('why', '')}, {idle} for {report.get('idle_s', '?')} s; "
            f"stacks in {report.get('dir', '?')}; {after}")


def summary(task_dir: str | os.PathLike) -> str:
    """The newest hang report of a task, described (hpc.status); '' when it never hung."""
    root = Path(task_dir) / HANGS
    reports = [HangDir(root / name, -1).report() for name in listed(root)]
    reports = [r for r in reports if isinstance(r, dict)]
    return describe(max(reports, key=lambda r: r.get("time", 0))) if reports else ""
