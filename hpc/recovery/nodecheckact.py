"""A failed node check carried out: the job requeued without the failed and avoided nodes, before any rank starts.

    nodecheckact.requeue_without(run_dir, os.environ, ["n2"], "node check failed on n2 (...)", resubmit_after)

The requeue is hpc.recovery.nodeaction's (scontrol requeue asked again while the controller gives
no answer, then the nodes added to the job's ExcNodeList and its node range restored; where SLURM
refuses the requeue, `resubmit_after` submits the stage again with the nodes in its extra.exclude).
Bounded: a job requeued for failed checks stages.X.max_node_failures times (HPC_MAX_NODE_FAILURES)
is stopped instead, so that a check that fails everywhere (a wrong site command) cannot requeue a
job until every node of the partition is excluded.
"""
from __future__ import annotations

import signal
from typing import Callable, Mapping, Optional, Sequence

from hpc.recovery import nodeaction, nodefail, preemption
from hpc.recovery import nodecheckrecord as record
from hpc.rundir.run import RunDir
from hpc.slurm import scheduler


def requeue_without(run_dir: str, env: Mapping[str, str], exclude: Sequence[str], why: str,
                    resubmit_after: Callable[..., str], points: Optional[str] = None) -> str:
    """Requeue this job without `exclude` (or stop it past the limit); what was done, in words. SIGTERM
    is ignored from then on: the requeue sends it to this process too (as hpc.afterstep does once it acted)."""
    job_id = scheduler.running_job(env)
    limit = nodefail.env_limit(env)
    if record.requeues(run_dir, env["SLURM_JOB_ID"]) >= limit:
        return (f"stopped: requeued {limit} time(s) already for failed node checks (stages.X.max_node_failures)."
                " HINT: check the nodes (sinfo -R) and the stage's node_check.command, then resubmit with --run-dir")
    run, _, stage, _ = nodeaction.located(RunDir(run_dir), env, points)  # a sweep's task: its point's run
    restart = int(env.get("SLURM_RESTART_COUNT") or 0)
    # ignored from here to this process's end: the job is being ended, and what is left (the record,
    # the log's line) must not die of the requeue's SIGTERM, which may come more than once
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    info = preemption.job_info(job_id)
    action = nodefail.Action("requeue", why, tuple(exclude))
    return nodeaction.carry_out(action, job_id, info, False, restart, str(run.path), stage, env, resubmit_after)
