"""The site's submit limits: how many jobs this user may have queued, asked of sacctmgr at most once.

    python -c "from hpc.slurm import limits; print(limits.submit_limit())"

Sites that enforce limits (AccountingStorageEnforce=limits,qos) refuse an sbatch that would take the
user past MaxSubmitJobsPerUser of the job's QOS (`QOSMaxSubmitJobPerUserLimit`) or MaxSubmitJobs of
the user's association (`AssocMaxSubmitJobLimit`); each task of an array counts as one job. A
submission checks its whole plan against the strictest of the two (check) before its first sbatch,
so that a run is never left half submitted by a limit hpc could read.

One `sacctmgr` call (its commands on stdin: the user's default account, associations and the QOS)
reads the limits; the answer, a limit or none, is kept in the user's cache (hpc.fs.usercache) as
limits-<its name> beside hpc.slurm.siteconfig's entry for MAX_AGE_S, so a site without accounting
or without limits costs that call once per MAX_AGE_S. Only where a limit exists is the user's count
of queued and running jobs asked of squeue, on every submission. Limits shared with other users or
the account (GrpSubmit, MaxSubmitPA) are not read: sbatch still refuses past them.
"""
from __future__ import annotations

import functools
import getpass
import json
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from hpc.fs.atomic import write_bytes
from hpc.slurm.cli import run as _run
from hpc.slurm.siteconfig import _entry as site_entry

MAX_AGE_S = 300  # a kept answer older than this is asked again (sacctmgr changes a limit at once)
ASK_TIMEOUT_S = 10.0  # sacctmgr's one try: a site whose slurmdbd does not answer submits unchecked
ECHO = "sacctmgr: "  # sacctmgr reading commands from stdin echoes each one before its answer


@dataclass(frozen=True)
class SubmitLimit:
    """The most jobs (array tasks counted one by one) this user may have queued or running."""

    jobs: int
    name: str  # what sets it, as the refusal names it: "QOS normal's MaxSubmitJobsPerUser"


def commands(user: str) -> str:
    """sacctmgr's stdin: the user's default account, associations, and every QOS's per-user limit."""
    return (f"show user where name={user} format=User,DefaultAccount\n"
            f"show assoc where user={user} format=Account,User,Partition,MaxSubmit,QOS,DefaultQOS\n"
            "show qos format=Name,MaxSubmitPU\n")


def parse(text: str) -> Optional[SubmitLimit]:
    """The strictest per-user submit limit in sacctmgr's answer to commands() (-n -P), None when none
    is set. The association is the default account's (a job without --account gets it), else the
    strictest of the user's; its QOS is DefaultQOS, else normal when listed, else the only one."""
    sections = _sections(text)
    default_account = next((row[1] for row in sections.get("user", []) if len(row) > 1), "")
    assocs = [row for row in sections.get("assoc", []) if len(row) >= 6 and row[2] == ""]
    assocs = [row for row in assocs if row[0] == default_account] or assocs
    qos_limit = {row[0]: int(row[1]) for row in sections.get("qos", []) if len(row) > 1 and row[1].isdigit()}
    found: List[SubmitLimit] = []
    for account, _, _, max_submit, qos_list, default_qos in (row[:6] for row in assocs):
        if max_submit.isdigit():
            found.append(SubmitLimit(int(max_submit), f"the association of account {account}'s MaxSubmitJobs"))
        listed = [q for q in qos_list.split(",") if q]
        qos = default_qos or ("normal" if "normal" in listed or not listed else listed[0] if len(listed) == 1 else "")
        if qos in qos_limit:
            found.append(SubmitLimit(qos_limit[qos], f"QOS {qos}'s MaxSubmitJobsPerUser"))
    return min(found, key=lambda limit: limit.jobs, default=None)


def _sections(text: str) -> Dict[str, List[List[str]]]:
    """sacctmgr's stdin answers by command ("user", "assoc", "qos"): rows of '|'-separated fields."""
    sections: Dict[str, List[List[str]]] = {}
    rows: List[List[str]] = []
    for line in text.splitlines():
        if line.startswith(ECHO):
            words = line[len(ECHO):].split()
            rows = sections.setdefault(words[1] if len(words) > 1 else "", [])
        elif line.strip():
            rows.append(line.strip().split("|"))
    return sections


def check(jobs: Sequence[int], limit: Optional[SubmitLimit], queued: int) -> Optional[str]:
    """The refusal line when `jobs` (per sbatch of the plan, the jobs it queues: 1, or an array's
    tasks) do not fit under `limit` beside the `queued` jobs the user has; None when they fit."""
    need = sum(jobs)
    if limit is None or not need or queued + need <= limit.jobs:
        return None
    parts = " + ".join(str(n) if n == 1 else f"an array of {n}" for n in jobs)
    shape = f" ({parts})" if len(jobs) > 1 or jobs[0] > 1 else ""
    room = max(0, limit.jobs - queued)
    return (f"this run needs {need} jobs in the queue at once{shape}; {limit.name} allows {limit.jobs} per "
            f"user and you have {queued} queued or running, so {room} more fit. Nothing was submitted. "
            "HINT: wait for your queued jobs to end, submit fewer tasks (a stage's items), or ask the "
            "site for a higher limit (sacctmgr show qos).")


def submit_limit() -> Optional[SubmitLimit]:
    """This user's submit limit: kept, else one sacctmgr call (then kept). A sacctmgr that fails
    (a site without accounting, a slurmdbd that does not answer) counts as no limit, kept too."""
    path = _entry()
    try:
        entry = json.loads(path.read_text())
        if 0 <= time.time_ns() - int(entry["at"]) <= MAX_AGE_S * 1_000_000_000:
            return SubmitLimit(**entry["limit"]) if entry["limit"] else None
    except (OSError, ValueError, KeyError, TypeError):
        pass
    try:
        stdin = functools.partial(subprocess.run, input=commands(getpass.getuser()))
        # one try, not retried: sbatch enforces the limit all the same, this only warns ahead of it
        limit = parse(_run(["sacctmgr", "-n", "-P"], runner=stdin, timeout_s=ASK_TIMEOUT_S, deadline_s=0))
    except RuntimeError:
        limit = None
    try:
        write_bytes(path, json.dumps({"at": time.time_ns(), "limit": limit and limit.__dict__}).encode(),
                    durable=False)
    except OSError:
        pass
    return limit


def queued_jobs() -> int:
    """The user's jobs pending or running, each array task counted (squeue -r)."""
    out = _run(["squeue", "-h", "-r", "-u", getpass.getuser(), "-t", "PENDING,RUNNING,SUSPENDED,REQUEUED",
                "-o", "%i"])
    return len(out.split())


def refuse_past_limit(jobs: Sequence[int]) -> None:
    """Raise LimitError with check()'s line when the plan's `jobs` cannot all be queued now."""
    limit = submit_limit()
    line = check(jobs, limit, queued_jobs()) if limit is not None else None
    if line:
        raise LimitError(line)


class LimitError(RuntimeError):
    """A plan larger than the site lets this user queue; nothing was submitted."""


def _entry() -> Path:
    """Beside MaxArraySize's entry of this shell's SLURM (hpc.slurm.siteconfig), under its own name."""
    kept = site_entry()
    return kept.with_name(f"limits-{kept.name}")
