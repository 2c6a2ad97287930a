"""Talking to SLURM: which executor, which partitions, one batched state query, cancel.

    python -c "from hpc import scheduler; print(scheduler.detect('auto'), scheduler.partitions())"

One sacct call answers for every job of a run (array tasks included), however many there are; squeue
is only the fallback when accounting is disabled. SLURM states map to hpc states through a table,
not branches. Why a pending job will never start is inferred from its upstream jobs' states in that
same answer (never_starts), not asked of squeue.
"""
from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from typing import Dict, Iterable, List, Mapping, Optional, Sequence

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
# A record that ends in one of these SLURM states puts the job back in the queue: a restart follows.
REQUEUED = frozenset({"REQUEUED", "PREEMPTED", "REQUEUE_HOLD", "REQUEUE_FED"})
# hpc states of an upstream job after which an afterok dependency can never be satisfied.
BREAKS_AFTEROK = frozenset({"FAILED", "CANCELLED", "TIMEOUT"})
# SLURM's reason for such a job (squeue shows it at once; sacct's Reason may still say Dependency).
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
    restarts: int  # requeues after preemption or time limit (see parse_sacct)


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
    """State of all `job_ids` ("123" or "123_4") from one sacct call, whatever their number.
    Pass the upstream job ids too: never_starts() reads their states from the same answer."""
    ids = sorted(set(job_ids))
    if not ids:
        return {}
    try:
        out = _run(["sacct", "-X", "-D", "-P", "-n", "-o", ",".join(SACCT_FIELDS), "-j", ",".join(base_ids(ids))])
    except RuntimeError:
        return _query_squeue(ids)  # accounting disabled: only queued jobs are known
    return parse_sacct(out, ids)


def parse_sacct(text: str, wanted: Iterable[str]) -> Dict[str, JobRecord]:
    """Records of the `wanted` job ids in `sacct -X -D -P` output.

    A pending array is one row (12_[0-2%4]): it stands for those of its tasks that are wanted and
    have no row of their own. sacct has no restart count (scontrol's Restarts= would cost a call per
    job); -D lists one record per start instead, so the records before the last are restarts, and a
    last record that ended in a requeue (PREEMPTED, REQUEUED) counts as one more.
    """
    wanted = set(wanted)
    rows: Dict[str, List[List[str]]] = {}
    arrays: List[List[str]] = []
    for line in text.splitlines():
        cols = line.split("|")
        if len(cols) == len(SACCT_FIELDS):
            (arrays if "_[" in cols[0] else rows.setdefault(cols[0], [])).append(cols)
    for cols in arrays:
        for jid in expand_array_id(cols[0]):
            if jid in wanted and jid not in rows:
                rows[jid] = [[jid, *cols[1:]]]
    return {jid: _record(rows[jid]) for jid in sorted(wanted) if jid in rows}


def _record(rows: List[List[str]]) -> JobRecord:
    jid, state, reason, elapsed, start, end, code, nodes = rows[-1]
    word = state.split()[0] if state else "UNKNOWN"  # "CANCELLED by 0"
    restarts = len(rows) - 1 + (word in REQUEUED)
    return JobRecord(jid, STATES.get(word, "UNKNOWN"), state, reason, elapsed, start, end, code, nodes, restarts)


def never_starts(records: Mapping[str, JobRecord],
                 after: Mapping[str, Sequence[str]]) -> Dict[str, Optional[JobRecord]]:
    """Pending jobs whose afterok can never be satisfied -> the upstream record that broke it
    (None when only SLURM's reason says so, e.g. the upstream job is no longer in sacct).
    `after`: job id -> the job ids it waits for. SLURM keeps such jobs pending forever."""
    out: Dict[str, Optional[JobRecord]] = {}
    for jid, rec in records.items():
        if rec.state != "PENDING":
            continue
        broken = [records[u] for u in after.get(jid, ()) if u in records and records[u].state in BREAKS_AFTEROK]
        if broken or NEVER in rec.reason:
            out[jid] = broken[0] if broken else None
    return out


def base_ids(job_ids: Iterable[str]) -> List[str]:
    """'12_3' -> '12': the distinct job ids that name whole arrays, sorted (sacct/squeue -j, afterok)."""
    return sorted({i.split("_")[0] for i in job_ids})


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
    out = _run(["squeue", "-h", "-o", "%i|%T|%r|%M|%S|%e|%N", "-j", ",".join(base_ids(ids))])
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
