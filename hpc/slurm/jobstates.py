"""SLURM's job states as hpc reads them: the state table and the parsers of sacct's and squeue's answers.

    python -c "from hpc.slurm.jobstates import hpc_state; print(hpc_state('CANCELLED by 0'))"   # CANCELLED

Pure functions of the clients' text, no call of SLURM (hpc.slurm.scheduler makes the calls, one per
poll, and re-exports these names). SLURM states map to hpc states through a table, not branches; a job
ended by its time limit is TIMEOUT whatever its state word (Reason=TimeLimit). Why a pending job will
never start is inferred from its upstream jobs' states in the same answer (never_starts).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Iterable, List, Mapping, Optional, Sequence

from hpc import Record

# SLURM state (first word of sacct's State, squeue's %T) -> hpc state
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
# SLURM's reasons that decide the outcome whatever the state word: a job killed at its time limit
# reads COMPLETING (scontrol, squeue) or CANCELLED while its steps are being killed.
REASONS: Dict[str, str] = {"TimeLimit": "TIMEOUT"}
ACTIVE = frozenset({"PENDING", "RUNNING", "PREEMPTED"})
# A record that ends in one of these SLURM states puts the job back in the queue: a restart follows.
REQUEUED = frozenset({"REQUEUED", "PREEMPTED", "REQUEUE_HOLD", "REQUEUE_FED"})
# hpc states of an upstream job after which an afterok dependency can never be satisfied.
BREAKS_AFTEROK = frozenset({"FAILED", "CANCELLED", "TIMEOUT"})
# SLURM's reason for such a job (squeue shows it at once; sacct's Reason may still say Dependency).
NEVER = "DependencyNeverSatisfied"
SACCT_FIELDS = ("JobID", "State", "Reason", "Elapsed", "Start", "End", "ExitCode", "NodeList")
HISTORY_FIELDS = ("JobID", "Submit", "Eligible", "Start", "End", "State", "Reason")  # each start (history)
# squeue -O with "|" as each field's suffix (an empty width never truncates); no exit code there.
SQUEUE_FIELDS = ("JobArrayID", "State", "Reason", "TimeUsed", "StartTime", "EndTime", "NodeList", "RestartCnt")


@dataclass(eq=False, repr=False)
class JobRecord(Record):
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


class Answer(Dict[str, JobRecord]):
    """Records by job id, and which back end gave them. With `source == "squeue"` a job that is
    missing has ended and been forgotten by slurmctld; with sacct it may just not be listed yet."""

    def __init__(self, records: Mapping[str, JobRecord], source: str):
        super().__init__(records)
        self.source = source


def hpc_state(slurm_state: str, reason: str = "") -> str:
    """hpc state of a SLURM state ("CANCELLED by 0", "COMPLETING+TIMEOUT") and its reason."""
    word = (slurm_state.split() or ["UNKNOWN"])[0].split("+")[0].upper()
    if reason in REASONS and STATES.get(word) not in ("COMPLETED", "PENDING"):
        return REASONS[reason]
    return STATES.get(word, "UNKNOWN")


def parse_sacct(text: str, wanted: Iterable[str]) -> Dict[str, JobRecord]:
    """Records of the `wanted` job ids in `sacct -X -D -P` output.

    A pending array is one row (12_[0-2%4]): it stands for those of its tasks that are wanted and
    have no row of their own. sacct has no restart count (scontrol's Restarts= would cost a call per
    job); -D lists one record per start instead, so the records before the last are restarts, and a
    last record that ended in a requeue (PREEMPTED, REQUEUED) counts as one more.
    """
    rows = _rows(text, len(SACCT_FIELDS), wanted, keep_all=True)
    out = {}
    for jid, recs in rows.items():
        _, state, reason, elapsed, start, end, code, nodes = recs[-1]
        restarts = len(recs) - 1 + ((state.split() or [""])[0] in REQUEUED)
        out[jid] = JobRecord(jid, hpc_state(state, reason), state, reason, elapsed, start, end, code, nodes,
                             restarts)
    return out


def parse_squeue(text: str, wanted: Iterable[str]) -> Dict[str, JobRecord]:
    """Records of the `wanted` job ids in `squeue -h -t all -O <SQUEUE_FIELDS, each with ':|'>` output."""
    out = {}
    for jid, recs in _rows(text, len(SQUEUE_FIELDS), wanted, keep_all=False).items():
        _, state, reason, used, start, end, nodes, restarts = recs[-1]
        out[jid] = JobRecord(jid, hpc_state(state, reason), state, reason, used, start, end, "", nodes,
                             int(restarts) if restarts.isdigit() else 0)
    return out


def _rows(text: str, width: int, wanted: Iterable[str], keep_all: bool) -> Dict[str, List[List[str]]]:
    """Rows by wanted job id; a pending array's row (12_[0-2]) stands for its tasks without their own."""
    wanted = set(wanted)
    rows: Dict[str, List[List[str]]] = {}
    arrays: List[List[str]] = []
    for line in text.splitlines():
        cols = [c.strip() for c in line.split("|")][:width]
        if len(cols) == width and cols[0]:
            (arrays if "_[" in cols[0] else rows.setdefault(cols[0], [])).append(cols)
    for cols in arrays:
        for jid in expand_array_id(cols[0]):
            if jid in wanted and jid not in rows:
                rows[jid] = [[jid, *cols[1:]]]
    return {jid: r if keep_all else r[-1:] for jid, r in sorted(rows.items()) if jid in wanted}


def never_starts(records: Mapping[str, JobRecord],
                 after: Mapping[str, Sequence[str]]) -> Dict[str, Optional[JobRecord]]:
    """Pending jobs whose afterok can never be satisfied -> the upstream record that broke it
    (None when only SLURM's reason says so, e.g. the upstream job is no longer known).
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
