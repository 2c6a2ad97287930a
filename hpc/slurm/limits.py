"""The site's submit limits: how many jobs this user may have queued, asked of sacctmgr at most once.

    python -c "from hpc.slurm import limits; print(limits.submit_limits())"

Sites that enforce limits (AccountingStorageEnforce=limits,qos) refuse an sbatch that would take the
user past MaxSubmitJobsPerUser of the job's QOS (`QOSMaxSubmitJobPerUserLimit`) or MaxSubmitJobs of
the user's association (`AssocMaxSubmitJobLimit`); each task of an array counts as one job. A
submission checks its whole plan against both before its first sbatch, so that a run is never left
half submitted by a limit hpc could read. A QOS's limit counts the user's jobs in that QOS, an
association's those in its account (whatever their QOS); a stage that asks for another QOS or account
(resources qos/account, or extra) than the one the limit was read for is not checked against it:
sbatch enforces that one, and the submission's partial-submission line names what it refused.
HPC_SUBMIT_LIMITS=off skips the check.

One `sacctmgr` call (its commands on stdin: the user's default account, associations and the QOS)
reads the limits; the answer, the limits or none, is kept in the user's cache (hpc.fs.usercache) as
slurm/limits-<digest>.json, named by the user and the cluster (hpc.slurm.siteconfig.site_key: the
client's environment and its slurm.conf's stat), for MAX_AGE_S, so a site without accounting or
without limits costs that call once per MAX_AGE_S. Only where a limit applies is the user's count of
queued and running jobs asked of squeue (one call per limit), on every submission; a squeue that
fails leaves the count unknown: one line on stderr, and the plan is not refused. Limits shared with
other users or the account (GrpSubmit, MaxSubmitPA) are not read: sbatch still refuses past them.
"""
from __future__ import annotations

import functools
import hashlib
import os
import pwd
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from hpc import Record
from hpc.fs import usercache
from hpc.fs.usercache import cache_dir
from hpc.slurm.cli import run as _run
from hpc.slurm.siteconfig import FOLDER, site_key

MAX_AGE_S = 300  # a kept answer older than this is asked again (sacctmgr changes a limit at once)
ASK_TIMEOUT_S = 10.0  # sacctmgr's one try: a site whose slurmdbd does not answer submits unchecked
ECHO = "sacctmgr: "  # sacctmgr reading commands from stdin echoes each one before its answer
OFF = "HPC_SUBMIT_LIMITS"  # =off: no check before the first sbatch (sbatch still enforces the limits)


@dataclass(eq=False, repr=False)
class SubmitLimit(Record):
    """The most jobs (array tasks counted one by one) this user may have queued or running in `qos`
    (of == "qos") or in `account` (of == "account"); both name what the limit was read for."""

    jobs: int
    name: str  # what sets it, as the refusal names it: "QOS normal's MaxSubmitJobsPerUser"
    of: str = "qos"  # what it counts: the user's jobs in its "qos", or in its "account"
    qos: str = ""  # the QOS it was read for: the association's default ('' when none is known)
    account: str = ""  # the account of the association it was read for

    def applies(self, qos: Optional[str], account: Optional[str]) -> bool:
        """Whether a job asking for `qos` and `account` (None: the default) counts against it."""
        if self.of == "qos" and qos is not None:
            return qos == self.qos
        return account is None or account == self.account


def commands(user: str) -> str:
    """sacctmgr's stdin: the user's default account, associations, and every QOS's per-user limit."""
    return (f"show user where name={user} format=User,DefaultAccount\n"
            f"show assoc where user={user} format=Account,User,Partition,MaxSubmit,QOS,DefaultQOS\n"
            "show qos format=Name,MaxSubmitPU\n")


def parse(text: str) -> List[SubmitLimit]:
    """The per-user submit limits in sacctmgr's answer to commands() (-n -P), strictest first; []
    when none is set. The association is the default account's (a job without --account gets it),
    else each of the user's; its QOS is DefaultQOS, else normal when listed, else the only one."""
    sections = _sections(text)
    default_account = next((row[1] for row in sections.get("user", []) if len(row) > 1), "")
    assocs = [row for row in sections.get("assoc", []) if len(row) >= 6 and row[2] == ""]
    assocs = [row for row in assocs if row[0] == default_account] or assocs
    qos_limit = {row[0]: int(row[1]) for row in sections.get("qos", []) if len(row) > 1 and row[1].isdigit()}
    found: List[SubmitLimit] = []
    for account, _, _, max_submit, qos_list, default_qos in (row[:6] for row in assocs):
        listed = [q for q in qos_list.split(",") if q]
        qos = default_qos or ("normal" if "normal" in listed or not listed else listed[0] if len(listed) == 1 else "")
        if max_submit.isdigit():
            found.append(SubmitLimit(int(max_submit), f"the association of account {account}'s MaxSubmitJobs",
                                     "account", qos, account))
        if qos in qos_limit:
            found.append(SubmitLimit(qos_limit[qos], f"QOS {qos}'s MaxSubmitJobsPerUser", "qos", qos, account))
    return sorted(found, key=lambda limit: limit.jobs)


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


def submit_limits() -> List[SubmitLimit]:
    """This user's submit limits, strictest first: kept, else one sacctmgr call (then kept). A
    sacctmgr that fails (a site without accounting, a slurmdbd that does not answer) counts as no
    limit, kept too."""
    path = _entry()
    entry = usercache.kept(path, MAX_AGE_S)
    try:
        if entry is not None:
            return [SubmitLimit(**limit) for limit in entry["limits"]]
    except (KeyError, TypeError):
        pass
    try:
        stdin = functools.partial(subprocess.run, input=commands(user()))
        # one try, not retried: sbatch enforces the limit all the same, this only warns ahead of it
        found = parse(_run(["sacctmgr", "-n", "-P"], runner=stdin, timeout_s=ASK_TIMEOUT_S, deadline_s=0))
    except RuntimeError:
        found = []
    usercache.keep(path, {"limits": [f.__dict__ for f in found]})
    return found


def queued_jobs(limit: SubmitLimit) -> Optional[int]:
    """The user's jobs pending or running that count against `limit` (those in its QOS, or in its
    account), each array task counted (squeue -r); None, after one line on stderr, when squeue fails."""
    where = ["-q", limit.qos] if limit.of == "qos" else ["-A", limit.account]
    try:
        out = _run(["squeue", "-h", "-r", "-u", user(), *where, "-t", "PENDING,RUNNING,SUSPENDED,REQUEUED",
                    "-o", "%i"])
    except RuntimeError as err:
        said = (str(err).splitlines() or [repr(err)])[0].split(" HINT:")[0]
        print(f"note: the submit limit was not checked, counting your queued jobs failed ({said}); "
              "sbatch enforces it", file=sys.stderr)
        return None
    return len(out.split())


def refuse_past_limit(jobs: Sequence[int], asks: Sequence[Mapping[str, Any]] = ()) -> None:
    """Raise LimitError with check()'s line when the plan's `jobs` cannot all be queued now; `asks`:
    each job's resources (its qos, account, extra), those of the default QOS and account when absent."""
    if os.environ.get(OFF, "").strip().lower() == "off":
        return
    wants = [_qos_account(res) for res in asks] + [(None, None)] * (len(jobs) - len(asks))
    for limit in submit_limits():
        counted = [n for n, (qos, account) in zip(jobs, wants) if limit.applies(qos, account)]
        if not sum(counted):
            continue
        queued = queued_jobs(limit)
        if queued is None:  # unknown: the other limits would ask the same squeue
            return
        line = check(counted, limit, queued)
        if line:
            raise LimitError(line)


def _qos_account(res: Mapping[str, Any]) -> Tuple[Optional[str], Optional[str]]:
    """The QOS and account a job's resources ask for (None: the default); extra's sbatch options last,
    as they come last in the job's script."""
    options = {str(k).lstrip("-").replace("_", "-"): v for k, v in dict(res.get("extra") or {}).items()}
    qos = options.get("qos", options.get("q", res.get("qos")))
    account = options.get("account", options.get("A", res.get("account")))
    return (None if qos is None else str(qos)), (None if account is None else str(account))


class LimitError(RuntimeError):
    """A plan larger than the site lets this user queue; nothing was submitted."""


def user() -> str:
    """This process's user as SLURM sees it: the name of its uid (not $USER, which may say otherwise)."""
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return str(os.getuid())


def _entry() -> Optional[Path]:
    """Where the answer is kept: named by the user and the cluster (siteconfig.site_key); None while
    the cluster's slurm.conf is racy."""
    site = site_key()
    if site is None:
        return None
    key = hashlib.sha256(f"{site}\0{user()}".encode(errors="surrogateescape")).hexdigest()[:16]
    return cache_dir() / FOLDER / f"limits-{key}.json"
