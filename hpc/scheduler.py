"""Talking to SLURM: which executor, which partitions, one batched state query, cancel.

    python -c "from hpc import scheduler; print(scheduler.detect('auto'), scheduler.partitions())"

One sacct call answers for every job of a run (array tasks included); squeue is the fallback when
accounting is disabled. SLURM states map to hpc states through a table, not branches.
"""
from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass, replace
from typing import Dict, Iterable, List, Optional

# SLURM state (first word of sacct's State) -> hpc state
STATES: Dict[str, str] = {
    "PENDING": "PENDING", "REQUEUED": "PENDING", "REQUEUE_HOLD": "PENDING", "REQUEUE_FED": "PENDING",
    "RESV_DEL_HOLD": "PENDING", "SUSPENDED": "PENDING", "STOPPED": "PENDING",
    "CONFIGURING": "RUNNING", "RUNNING": "RUNNING", "COMPLETING": "RUNNING", "RESIZING": "RUNNING",
    "SIGNALING": "RUNNING", "STAGE_OUT": "RUNNING",
    "COMPLETED": "COMPLETED",
    "FAILED": "FAILED", "NODE_FAIL": "FAILED", "BOOT_FAIL": "FAILED", "OUT_OF_MEMORY": "FAILED",
    "DEADLINE": "FAILED", "TIMEOUT": "TIMEOUT", "PREEMPTED": "PREEMPTED", "CANCELLED": "CANCELLED",
    "REVOKED": "CANCELLED", "SPECIAL_EXIT": "FAILED",
}
ACTIVE = frozenset({"PENDING", "RUNNING", "PREEMPTED"})
# A pending job whose afterok dependency failed: SLURM keeps it forever with this reason.
NEVER = "DependencyNeverSatisfied"
SACCT_FIELDS = ("JobID", "State", "Reason", "Elapsed", "Start", "End", "ExitCode", "NodeList")


@dataclass(frozen=True)
class JobRecord:
    job_id: str
    state: str  # hpc state (STATES values, or UNKNOWN)
    slurm_state: str
    reason: str
    elapsed: str
    start: str
    end: str
    exit_code: str
    nodes: str
    restarts: int  # earlier records of the same id (requeues after preemption or timeout)

    @property
    def orphaned(self) -> bool:
        return self.state == "PENDING" and NEVER in self.reason


def detect(kind: str) -> str:
    """auto -> slurm when sbatch is on PATH and the controller answers, else local."""
    if kind != "auto":
        return kind
    if not shutil.which("sbatch"):
        return "local"
    conf = os.environ.get("SLURM_CONF", "/etc/slurm/slurm.conf")
    if not os.path.exists(conf):
        return "local"  # without a config file the client falls back to slow DNS SRV lookups
    try:
        ok = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return "local"
    return "slurm" if ok.returncode == 0 and "UP" in ok.stdout else "local"


def partitions() -> List[str]:
    """Partitions of the cluster (one sinfo call)."""
    out = _run(["sinfo", "-h", "-o", "%P"])
    return sorted({line.strip().rstrip("*") for line in out.splitlines() if line.strip()})


def query(job_ids: Iterable[str]) -> Dict[str, JobRecord]:
    """State of all `job_ids` ("123" or "123_4"): one sacct call for the whole run, plus one squeue
    call when some job pends (sacct does not know why a job pends, e.g. DependencyNeverSatisfied,
    and does not list a pending array's tasks when asked for them by task id)."""
    ids = sorted(set(job_ids))
    if not ids:
        return {}
    bases = ",".join(sorted({i.split("_")[0] for i in ids}))
    try:
        out = _run(["sacct", "-X", "-D", "-P", "-n", "-o", ",".join(SACCT_FIELDS), "-j", bases])
    except RuntimeError:
        return _query_squeue(ids)  # accounting disabled: only queued jobs are known
    records = parse_sacct(out, ids)
    pending = [i for i, r in records.items() if r.state == "PENDING"]
    if pending:
        live = _query_squeue(pending)
        records.update({i: replace(records[i], reason=r.reason) for i, r in live.items() if i in records})
    return records


def parse_sacct(text: str, wanted: Iterable[str]) -> Dict[str, JobRecord]:
    """Last record per job id wins; the ones before it count as restarts (-D lists requeues)."""
    rows: Dict[str, List[List[str]]] = {}
    for line in text.splitlines():
        cols = line.split("|")
        if len(cols) == len(SACCT_FIELDS):
            for jid in expand_array_id(cols[0]):  # a pending array is one line: 12_[0-2%4]
                rows.setdefault(jid, []).append([jid, *cols[1:]])
    result = {}
    for job_id in wanted:
        if job_id in rows:
            jid, state, reason, elapsed, start, end, code, nodes = rows[job_id][-1]
            word = state.split()[0] if state else "UNKNOWN"
            result[job_id] = JobRecord(jid, STATES.get(word, "UNKNOWN"), state, reason, elapsed,
                                       start, end, code, nodes, len(rows[job_id]) - 1)
    return result


def expand_array_id(job_id: str) -> List[str]:
    """'12_[0-2,5%4]' -> ['12_0', '12_1', '12_2', '12_5']; other ids unchanged."""
    base, sep, rest = job_id.partition("_[")
    if not sep:
        return [job_id]
    ids = []
    for part in rest.rstrip("]").split("%")[0].split(","):
        lo, _, hi = part.partition("-")
        ids += [f"{base}_{i}" for i in range(int(lo), int(hi or lo) + 1)]
    return ids


def _query_squeue(ids: List[str]) -> Dict[str, JobRecord]:
    bases = ",".join(sorted({i.split("_")[0] for i in ids}))
    out = _run(["squeue", "-h", "-o", "%i|%T|%r|%M|%S|%e|%N", "-j", bases])
    result = {}
    for line in out.splitlines():
        cols = line.split("|")
        for jid in expand_array_id(cols[0]) if len(cols) == 7 else []:
            word = cols[1].split()[0]
            result[jid] = JobRecord(jid, STATES.get(word, "UNKNOWN"), cols[1], cols[2],
                                    cols[3], cols[4], cols[5], "", cols[6], 0)
    return {i: r for i, r in result.items() if i in ids}


def cancel(job_ids: Iterable[str]) -> List[str]:
    ids = sorted(set(job_ids))
    if ids:
        _run(["scancel", *ids])
    return ids


def _run(cmd: List[str]) -> str:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=os.environ)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise RuntimeError(f"{cmd[0]} failed: {err}. HINT: is SLURM_CONF pointing at a running cluster?") from None
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:2])} exited {out.returncode}: {out.stderr.strip()}. "
                           "HINT: is SLURM_CONF pointing at a running cluster?")
    return out.stdout
