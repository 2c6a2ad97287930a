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

The state table and the parsers of both answers are hpc.slurm.jobstates' (pure, no call of SLURM).

Running the clients and asking whether SLURM is here is hpc.slurm.cli's; acting on jobs (requeue,
cancel, ...) is hpc.slurm.jobcontrol's; MaxArraySize, kept per slurm.conf, hpc.slurm.siteconfig's. All
are re-exported here, so `hpc.slurm.scheduler` stays the one name callers use.
"""
from __future__ import annotations

import os
import sys
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

from hpc.slurm.cli import PING_TIMEOUT_S, Kind, SlurmExit, detect, ping  # noqa: F401 (re-exported)
from hpc.slurm.cli import run as _run
from hpc.slurm.jobcontrol import cancel, job_info, node_states, requeue, running_job, start_now, update_job  # noqa: F401 (re-exported)
from hpc.slurm.jobstates import (  # noqa: F401 (re-exported)
    ACTIVE,
    BREAKS_AFTEROK,
    HISTORY_FIELDS,
    NEVER,
    REASONS,
    REQUEUED,
    SACCT_FIELDS,
    SQUEUE_FIELDS,
    STATES,
    Answer,
    JobRecord,
    _rows,
    base_ids,
    expand_array_id,
    hpc_state,
    never_starts,
    parse_sacct,
    parse_squeue,
)
from hpc.slurm.retry import deadline_s as _deadline_s
from hpc.slurm.siteconfig import SHOW_CONFIG, max_array_size, parse_max_array_size  # noqa: F401 (re-exported)

NO_ACCOUNTING = "accounting storage is disabled"  # sacct's words on a site without slurmdbd
UNKNOWN_JOB = "Invalid job id specified"
SACCT_RETRY_S = 5.0  # slurmdbd down or slow: squeue answers the poll after this, not after a minute


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

