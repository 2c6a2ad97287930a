"""Putting a job back in the queue so that it runs again as it was asked for, not as it last ran.

    python -c "from hpc import requeue; print(requeue.fields((1, 2), 2, ['n2']))"
    # {'NumNodes': '1-2', 'NumTasks': '2', 'ExcNodeList': 'n2'}

- Node ranges. Slurm 22.05 requeues a job with NumTasks pinned to its last allocation's: a
  `--nodes=1-2 --ntasks-per-node=2` job that ran on 2 nodes comes back asking for 4 tasks, which
  only 2 nodes hold, so with a node gone it pends for good. The range itself is kept. After every
  requeue hpc sets NumTasks back to MIN x tasks per node, what sbatch asked for at submission; SLURM
  grants any count of the range again and the tasks follow the nodes (--ntasks-per-node).
- Failed nodes join the job's ExcNodeList.
- SLURM refuses both while the job runs ("Job is no longer pending execution") and takes them once
  the requeue has begun (COMPLETING) or the job pends. The job's processes are being ended then
  (SIGTERM, and SIGKILL KillWait seconds later): an scontrol started meanwhile can die of that
  SIGTERM, so each update is tried again.
- `scontrol requeue` at a stop runs in the job's last seconds, against a controller that may be busy
  or restarting ("Socket timed out on send/recv operation", "Unable to contact slurm controller"):
  such an answer is no refusal, and it is asked again (hpc.slurm.cli.run) until the deadline the
  job's EndTime leaves (within_grace: a preemption's GraceTime, or the time limit). until_queued then
  asks whether SLURM took the request all the same (an answer lost on its way back). A refusal
  (requeue disabled, access denied, an unknown job) is never asked again.
- Where requeue is refused (JobRequeue=0, a site's job_submit plugin, `scontrol requeue` denied),
  hpc.afterstep submits a one-task job that waits for this one to end (afterany) and then submits
  the stage again into the same run directory with the failed nodes excluded, as a user would; the
  stages that waited on the failed job are submitted again with it.
"""
from __future__ import annotations

import logging
import os
import time
from typing import Any, Callable, Dict, Mapping, Optional, Sequence, Tuple

from hpc.recovery import deadline, hostact, inplace
from hpc.slurm import hostlist, noderange, scheduler
from hpc.slurm import retry as slurm_retry

log = logging.getLogger(__name__)
UNSET = {"", "(null)", "None"}  # what scontrol shows for a field without a value


def requested(environ: Mapping[str, str] = os.environ) -> Optional[Tuple[Tuple[int, int], int]]:
    """((MIN, MAX) nodes, tasks per node) the job asked for: HPC_NODES, which hpc's batch script
    exports, and SLURM's task count per node. None outside such a job."""
    nodes, per_node = environ.get("HPC_NODES", ""), environ.get("SLURM_NTASKS_PER_NODE", "")
    if not nodes:
        return None
    if not per_node.isdigit():  # no --ntasks-per-node: the tasks the job got over its nodes
        tasks, count = environ.get("SLURM_NTASKS", ""), environ.get("SLURM_JOB_NUM_NODES", "")
        per_node = str(int(tasks) // int(count)) if tasks.isdigit() and count.isdigit() and int(count) else "1"
    return noderange.bounds(nodes), int(per_node)


def fields(nodes: Optional[Tuple[int, int]], tasks_per_node: int, exclude: Sequence[str] = ()) -> Dict[str, str]:
    """The `scontrol update` fields that restore a node range and exclude nodes ({} for neither)."""
    out = {}
    if nodes and nodes[0] != nodes[1]:
        out.update(NumNodes=noderange.show(nodes), NumTasks=str(nodes[0] * tasks_per_node))
    if exclude:
        out["ExcNodeList"] = ",".join(sorted(set(exclude)))
    return out


def excluded(info: Mapping[str, str]) -> list:
    """The nodes a job already excludes (`scontrol show job`'s ExcNodeList)."""
    value = info.get("ExcNodeList", "")
    return [] if value in UNSET else hostlist.expand(value)


def adding(info: Mapping[str, str], more: Sequence[str]) -> list:
    """The job's ExcNodeList with `more` added ([] when `more` is empty: nothing to set): fields()
    replaces the list, so the nodes it already excludes are named again."""
    return sorted(set(excluded(info)) | set(more)) if more else []


def after_requeue(job_id: str, exclude: Sequence[str] = (), environ: Mapping[str, str] = os.environ,
                  tries: int = 6) -> Dict[str, str]:
    """Once the job is being requeued: its node range back and `exclude` excluded. Returns the
    fields set ({} when there was nothing to do); raises scheduler.SlurmExit if SLURM refused.
    A stage with spare nodes asked sbatch for its range plus the spares (hpc.pipeline.sbatch), and
    gets that back: its training range alone would requeue it without its spares."""
    todo = restored(environ, exclude)
    if todo:
        retry(lambda: scheduler.update_job(job_id, todo), tries)
    return todo


def restored(environ: Mapping[str, str], exclude: Sequence[str] = ()) -> Dict[str, str]:
    """after_requeue's fields for the job running in `environ`: its range as sbatch asked for it, the
    spare nodes (hpc.recovery.inplace.spare) included, and `exclude`."""
    shape = requested(environ)
    spare = inplace.spare(environ)
    nodes = (shape[0][0] + spare, shape[0][1] + spare) if shape else None
    return fields(nodes, shape[1] if shape else 1, exclude)


def retry(call: Any, tries: int, pause_s: float = 0.2) -> Any:
    """`call()`, again after a failure (an scontrol killed by the job's SIGTERM exits non-zero)."""
    for attempt in range(1, tries + 1):
        try:
            return call()
        except scheduler.SlurmExit as err:
            if attempt == tries:
                raise
            log.warning("try %d of %d: %s", attempt, tries, err)
            time.sleep(pause_s * attempt)


SIGNAL_TRIES = 3  # a client killed by the job's own stop signals: the job is being ended, more will not help
MARGIN_S = 2.0  # the retries end this long before EndTime (at most half of what is left): see within_grace


def within_grace(info: Mapping[str, str], now: Optional[float] = None) -> float:
    """The Unix time until which a stop's requeue is asked again: the job's EndTime (PreemptTime +
    GraceTime on a preemption, the time limit otherwise) less MARGIN_S, at most half of what is left
    (hpc.recovery.deadline.decide_by), so that the ranks still exit on the answer before SLURM ends
    the job. Never more than half of the time a rank waits for the host's answer
    (hpc.recovery.hostact.ANSWER_WAIT_S): a hang's EndTime is the time limit."""
    now = time.time() if now is None else now
    bound = now + hostact.ANSWER_WAIT_S / 2
    if deadline.end_time(info) is None:
        # No EndTime: `scontrol show job` gave no answer, most often a controller restarting, the very
        # case the retries are for; decide_by's few seconds would give the requeue one try, and the job
        # would lose its place to a resubmission (which needs that same controller). The GraceTime is
        # unknown, but the rank's wait is not: the host answers within it, and this bound leaves the
        # other half for what follows the requeue (the node range, a resubmission, the answer).
        return bound
    return min(deadline.decide_by(info, now, MARGIN_S), bound)


def no_answer(words: str) -> bool:
    """Whether SLURM's `words` say the controller gave no answer (hpc.slurm.retry's table), not a refusal."""
    return slurm_retry.classify(words) == slurm_retry.TRANSIENT


def until_queued(ask: Callable[[Callable[..., Any], float], None], taken: Callable[[], bool], by: float,
                 runner: Callable[..., Any]) -> str:
    """`ask(runner, seconds)` (an scontrol requeue, which hpc.slurm.cli.run asks again, with backoff
    and jitter, while the controller gives no answer, for the seconds given: until `by`, a Unix time,
    within_grace) until the job is queued again: '' once it is, else SLURM's last words. After a
    failure `taken()` says whether SLURM requeued the job all the same (an answer lost on its way
    back); a client killed by a signal is run again, up to SIGNAL_TRIES times; a refusal is final."""
    for tries in range(1, SIGNAL_TRIES + 1):
        try:
            ask(bounded(runner, by), max(0.0, by - time.time()))
            return ""
        except RuntimeError as err:
            if taken():
                return ""
            seen = str(err).partition(" HINT:")[0]
            if getattr(err, "returncode", 1) >= 0 or time.time() >= by:
                return seen
            log.warning("try %d of %d: %s", tries, SIGNAL_TRIES, seen)
    return seen


def bounded(runner: Callable[..., Any], by: float) -> Callable[..., Any]:
    """`runner` whose `timeout` never reaches past `by` (at least a second): one call that hangs
    cannot use up the time left for the others."""
    def run(*args: Any, **kwargs: Any) -> Any:
        kwargs["timeout"] = max(1.0, min(kwargs.get("timeout") or float("inf"), by - time.time()))
        return runner(*args, **kwargs)
    return run
