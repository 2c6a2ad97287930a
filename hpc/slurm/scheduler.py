"""Reading SLURM's job states: the one parser of sacct's and squeue's answers.

Job states come from one call per poll, whatever the number of jobs (array tasks included), through
one of two back ends:

- accounting (sacct): every job the database holds, with one record per start (restarts);
- no accounting (squeue -t all), chosen once sacct says "accounting storage is disabled": the jobs
  slurmctld still holds, the ended ones included for MinJobAge seconds. A job missing from that
  answer has ended; its outcome is read from what it left in the run directory (hpc.status).
  scontrol would know nothing more (it reads the same memory), so it costs no call per job.
  squeue also answers a poll whose sacct fails for another reason (slurmdbd down or slow: sacct is
  retried for SACCT_RETRY_S only), and hpc says once on stderr that accounting is unreachable.

An empty squeue answer for jobs that were asked about is not taken on trust (a loaded controller
may answer nothing): `scontrol show job` of the newest of them says whether slurmctld has forgotten
them (then the answer stands) or not (then squeue is asked once more, and a second empty answer is
an error: a submission never resubmits tasks whose state it cannot know).

SLURM states map to hpc states through a table, not branches; a job ended by its time limit is
TIMEOUT whatever its state word (Reason=TimeLimit). Why a pending job will never start is inferred
from its upstream jobs' states in that same answer (never_starts).

Running the clients and asking whether SLURM is here is hpc.slurm.cli's; acting on jobs (requeue,
cancel, ...) is hpc.slurm.jobcontrol's; MaxArraySize, kept per slurm.conf, hpc.slurm.siteconfig's. All
are re-exported here, so `hpc.slurm.scheduler` stays the one name callers use.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from hpc.slurm.cli import PING_TIMEOUT_S, Kind, SlurmExit, detect, ping  # noqa: F401 (re-exported)
from hpc.slurm.cli import run as _run
from hpc.slurm.jobcontrol import cancel, job_info, node_states, requeue, start_now, update_job  # noqa: F401 (re-exported)
from hpc.slurm.retry import deadline_s as _deadline_s
from hpc.slurm.siteconfig import SHOW_CONFIG, max_array_size, parse_max_array_size  # noqa: F401 (re-exported)

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
NO_ACCOUNTING = "accounting storage is disabled"  # sacct's words on a site without slurmdbd
UNKNOWN_JOB = "Invalid job id specified"
SACCT_RETRY_S = 5.0  # slurmdbd down or slow: squeue answers the poll after this, not after a minute


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


def partitions() -> List[str]:
    """Partitions of the cluster (one sinfo call)."""
    out = _run(["sinfo", "-h", "-o", "%P"])
    return sorted({line.strip().rstrip("*") for line in out.splitlines() if line.strip()})


# ---------------------------------------------------------------- job states, one call per poll
# Sites (how this shell finds its cluster) whose sacct said accounting is disabled: asked once per
# process, so a poll loop makes one call per poll.
_NO_ACCOUNTING: set = set()


def _site() -> Tuple[str, str]:
    return os.environ.get("SLURM_CONF", ""), os.environ.get("SLURM_CONF_SERVER", "")


def query(job_ids: Iterable[str]) -> Answer:
    """State of all `job_ids` ("123" or "123_4") from one call, whatever their number.
    Pass the upstream job ids too: never_starts() reads their states from the same answer."""
    ids = sorted(set(job_ids))
    if not ids:
        return Answer({}, "squeue" if _site() in _NO_ACCOUNTING else "sacct")
    if _site() not in _NO_ACCOUNTING:
        try:
            out = _run(["sacct", "-X", "-D", "-P", "-n", "-o", ",".join(SACCT_FIELDS), "-j", ",".join(base_ids(ids))],
                       deadline_s=min(SACCT_RETRY_S, _deadline_s()))
            return Answer(parse_sacct(out, ids), "sacct")
        except RuntimeError as err:  # slurmdbd down: squeue answers this poll; disabled: every poll
            if NO_ACCOUNTING in str(err):
                _NO_ACCOUNTING.add(_site())
            else:
                _say_unreachable(str(err))
    return Answer(parse_squeue(_squeue_checked(ids), ids), "squeue")


_SAID: set = set()


def _say_unreachable(err: str) -> None:
    """One line per process on stderr: sacct failed, so the states come from squeue."""
    if _site() not in _SAID:
        _SAID.add(_site())
        words = err.split(". HINT:")[0]
        print(f"[hpc] accounting unreachable ({words}): states from squeue, which lists only the jobs "
              "slurmctld still holds", file=sys.stderr, flush=True)


def _squeue_known(ids: Sequence[str]) -> str:
    try:
        return _squeue(ids)
    except RuntimeError as err:
        if UNKNOWN_JOB not in str(err):
            raise
        return ""  # squeue -j with a single id that slurmctld has forgotten fails; with several it lists the rest


def _squeue_checked(ids: Sequence[str]) -> str:
    """squeue's answer for `ids`; an empty one is checked with scontrol (see the module's doc)."""
    out = _squeue_known(ids)
    if out.strip():
        return out
    newest = max(base_ids(ids), key=lambda b: (len(b), b))
    try:
        job_info(newest)
    except SlurmExit as err:
        if UNKNOWN_JOB in str(err):
            return out  # slurmctld has forgotten them: they have ended
        raise
    out = _squeue_known(ids)
    if out.strip():
        return out
    raise RuntimeError(f"squeue answered nothing twice for {len(base_ids(ids))} job(s) while scontrol still shows "
                       f"job {newest}; expected their states. HINT: try again when the controller is less busy: "
                       "hpc does not resubmit tasks whose state it cannot know")


def confirm_active(answer: Answer) -> Answer:
    """The answer with sacct's still-active records checked against slurmctld (one squeue call, and
    none when nothing is active). slurmdbd learns of a job's end after the controller, seconds later
    on a busy site; a submission that trusted it would skip a task as "already queued" that has just
    failed. A job slurmctld lists as ended takes its record; one it has forgotten keeps sacct's."""
    active = [jid for jid, rec in answer.items() if rec.state in ACTIVE]
    if answer.source != "sacct" or not active:
        return answer
    try:
        out = _squeue(active)
    except RuntimeError:  # the controller not answering is no reason to submit a task twice
        return answer
    seen = parse_squeue(out, active)
    ended = {jid: rec for jid, rec in seen.items() if rec.state not in ACTIVE}
    return Answer({**answer, **ended}, answer.source)


def _squeue(ids: Sequence[str]) -> str:
    """`squeue -t all` for the arrays and jobs of `ids`, every SQUEUE_FIELDS column (parse_squeue)."""
    fields = ",".join(f"{f}:|" for f in SQUEUE_FIELDS)
    return _run(["squeue", "-h", "-t", "all", "-O", fields, "-j", ",".join(base_ids(ids))])


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


def history(job_ids: Iterable[str]) -> Optional[Dict[str, List[Dict[str, str]]]]:
    """Every start of each job, as HISTORY_FIELDS -> value, from one `sacct -D` call (a requeued job
    has one record per start); None where accounting is disabled (hpc.monitor.timeline)."""
    ids = sorted(set(job_ids))
    if _site() in _NO_ACCOUNTING:
        return None
    if not ids:
        return {}
    try:
        out = _run(["sacct", "-X", "-D", "-P", "-n", "-o", ",".join(HISTORY_FIELDS), "-j", ",".join(base_ids(ids))])
    except RuntimeError as err:
        if NO_ACCOUNTING not in str(err):
            raise
        _NO_ACCOUNTING.add(_site())
        return None
    rows = _rows(out, len(HISTORY_FIELDS), ids, keep_all=True)
    return {jid: [dict(zip(HISTORY_FIELDS, r)) for r in recs] for jid, recs in rows.items()}


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
