"""Each node of a job checked before a stage's ranks start, as ONE srun step with one task per node: a node
that fails is excluded before any training, and one that fails `avoid_after` checks in a run (2 by
default) is avoided for the rest of the run.

How the batch script's wrapper (hpc.afterstep) calls it, before each srun, where the stage's batch
script exports HPC_NODE_CHECK (stages.X.node_check, hpc.pipeline.sbatch.node_check)::

    from hpc.recovery import nodecheck
    verdict = nodecheck.before_step(run_dir, os.environ, resubmit_after, points)
    if not verdict.go:          # requeued without the failed nodes (or stopped): no srun of the ranks
        print(verdict.line); return verdict.code

A restart in place or a spare node picks its own nodes with the lower-level call, which runs the
step and writes the record, and reads the avoid list for any requeue's --exclude::

    section = nodecheck.options(os.environ)             # None where the stage has no check
    healthy, failed = nodecheck.check_before_step(run_dir, job_nodes, section, os.environ)
    exclude = nodecheck.avoided(run_dir, os.environ)    # [] where the stage has no check

What a node runs is hpc.recovery.nodecheckprobe; the records and the avoid list are
hpc.recovery.nodecheckrecord's. Why a node is excluded from its job at once but avoided by the
whole run only after a second failure: docs/nodecheck.md.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from hpc.recovery import nodecheckprobe as probe
from hpc.recovery import nodecheckrecord as record
from hpc.slurm import hostlist

ENV = "HPC_NODE_CHECK"  # the stage's node_check section as JSON (hpc.pipeline.sbatch.node_check)
SRUN_MARGIN_S = 20.0  # srun's own start and end on top of the nodes' bound, before it is ended


@dataclass(frozen=True)
class Verdict:
    """What the wrapper does next: `go` run srun; else exit with `code`. `line` for the job's log."""

    go: bool
    line: str = ""
    code: int = 0
    healthy: Tuple[str, ...] = ()


def options(env: Mapping[str, str]) -> Optional[Dict[str, Any]]:
    """The stage's node_check section from HPC_NODE_CHECK; None when the check is off."""
    text = env.get(ENV, "")
    if not text:
        return None
    section = json.loads(text)
    return section if section.get("enabled") or section.get("command") else None


def avoided(run_dir: Any, env: Mapping[str, str]) -> List[str]:
    """The run's avoid list where the stage checks its nodes (HPC_NODE_CHECK), else []: what a requeue
    or a resubmission of the job adds to the nodes it excludes."""
    section = options(env)
    return record.avoided(run_dir, int(section.get("avoid_after") or 2)) if section else []


def srun_command(nodes: Sequence[str], section: Mapping[str, Any], python: str = sys.executable) -> List[str]:
    """One step, one task on each of `nodes`, each running the probe; a failing task ends no other."""
    count = str(len(nodes))
    return ["srun", f"--nodes={count}", f"--ntasks={count}", "--ntasks-per-node=1",
            f"--nodelist={','.join(nodes)}", "--kill-on-bad-exit=0", "--job-name=hpc-nodecheck",
            python, "-u", "-m", "hpc.recovery.nodecheckprobe", json.dumps(dict(section), sort_keys=True)]


def answers(output: str) -> Dict[str, Dict[str, Any]]:
    """Each node's answer from srun's output (lines MARK + JSON; anything else is ignored)."""
    found = {}
    for line in output.splitlines():
        if line.startswith(probe.MARK):
            try:
                answer = json.loads(line[len(probe.MARK):])
                found[str(answer["node"])] = answer
            except (ValueError, KeyError, TypeError):
                continue
    return found


def judge(nodes: Sequence[str], answered: Mapping[str, Mapping[str, Any]], avoid: Sequence[str],
          silent: str) -> Tuple[List[str], Dict[str, str], str]:
    """(healthy nodes, {failed node: reason}, a note) from the nodes' answers; pure. A node that did
    not answer has failed (`silent`: what srun said, or the bound), unless none did: then the step
    itself failed (srun refused, the probe could not start anywhere), which is no node's fault, and
    nothing is excluded for it. A failed collective is noted, not blamed: each node sees the same
    error, whichever node caused it."""
    failed = {n: f"{record.AVOIDED} failed its check in this run before; not checked again" for n in avoid}
    checked = [n for n in nodes if n not in failed]
    if checked and not answered:
        return checked, failed, "no node answered the check: the check step failed, not a node"
    for node in checked:
        said = answered.get(node)
        if said is None:
            failed[node] = f"no answer ({silent})"
        elif not said.get("ok"):
            failed[node] = "; ".join(said.get("reasons") or ["failed"])
    said = [str(a.get("collective") or "") for a in answered.values()]
    together = sorted({s for s in said if s not in ("", probe.PASSED)})
    note = f"the collective failed, which names no node by itself: {together[0]}" if together else \
        f"the collective passed on {said.count(probe.PASSED)} node(s)" * (probe.PASSED in said)
    return [n for n in nodes if n not in failed], failed, note


def run_step(command: Sequence[str], bound_s: float, env: Mapping[str, str]) -> Tuple[str, str]:
    """(srun's output, what went wrong or ''); srun is ended after `bound_s` (two SIGINTs: SLURM ends
    the step's tasks, so the ranks' step never waits on a node's hung check for its CPUs)."""
    proc = subprocess.Popen(list(command), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(env), stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=bound_s)
        return out, "" if proc.returncode == 0 else f"srun exited {proc.returncode}: {err.strip()[-300:]}"
    except subprocess.TimeoutExpired:
        for sig in (signal.SIGINT, signal.SIGINT):  # its own process group: whatever holds its output ends too
            os.killpg(proc.pid, sig)
        try:
            out, _ = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
        return out, f"srun did not end within {bound_s:g} s"


def check_before_step(run_dir: Any, job_nodes: Sequence[str], section: Mapping[str, Any],
                      env: Mapping[str, str]) -> Tuple[List[str], Dict[str, str]]:
    """Check `job_nodes` (the avoided ones are failed unchecked), write the record: (healthy, failed)."""
    healthy, failed, _ = check(run_dir, job_nodes, section, env)
    return healthy, failed


def check(run_dir: Any, job_nodes: Sequence[str], section: Mapping[str, Any], env: Mapping[str, str]
          ) -> Tuple[List[str], Dict[str, str], Any]:
    """check_before_step, and the record's path."""
    bound = float(section.get("timeout_s") or 60)
    avoid = [n for n in record.avoided(run_dir, int(section.get("avoid_after") or 2)) if n in job_nodes]
    todo = [n for n in job_nodes if n not in avoid]
    out, trouble = run_step(srun_command(todo, section), bound + SRUN_MARGIN_S, env) if todo else ("", "")
    said = answers(out)
    healthy, failed, note = judge(job_nodes, said, avoid, trouble or f"none within {bound:g} s")
    note = "; ".join(w for w in (note, trouble) if w)
    path = record.write(run_dir, env.get("SLURM_JOB_ID", "0"), env.get("SLURM_RESTART_COUNT") or "0",
                        job_nodes, failed, said, note)
    return healthy, failed, path


def before_step(run_dir: str, env: Mapping[str, str], resubmit_after: Callable[..., str],
                points: Optional[str] = None, spare: int = 0) -> Verdict:
    """The wrapper's one call: check the job's nodes when the stage asks for it; failed nodes are
    left out where the job's `spare` nodes replace them (its ranks start on `healthy`), and have the
    job requeued without them (and every avoided node) otherwise, before any rank starts."""
    try:
        section = options(env)
        if section is None:
            return Verdict(True)
        nodes = hostlist.expand(env["SLURM_JOB_NODELIST"])
        healthy, failed, path = check(run_dir, nodes, section, env)
    except Exception as err:  # a check that cannot run never stops the job: its ranks start as without it
        return Verdict(True, f"node check not run: {type(err).__name__}: {err}")
    said = ", ".join(f"{n} ({why})" for n, why in sorted(failed.items()))
    if not failed:
        return Verdict(True, f"node check: {len(healthy)} node(s) passed", healthy=tuple(healthy))
    if len(failed) <= spare:  # the spares take their place: no trip through the queue
        done = f"left out: the job's {spare} spare node(s) replace them"
        record.done(path, done)
        return Verdict(True, f"node check failed on {said}: {done}", healthy=tuple(healthy))
    from hpc.recovery import nodecheckact  # here: only a failed check acts on SLURM

    exclude = sorted(set(failed) | set(avoided(run_dir, env)))
    try:
        done = nodecheckact.requeue_without(run_dir, env, exclude, f"node check failed on {said}", resubmit_after,
                                            points)
    except Exception as err:  # SLURM refused both the requeue and the resubmission: no rank starts on a failed node
        done = f"stopped: neither requeued nor resubmitted ({type(err).__name__}: {err})"
    record.done(path, done)
    return Verdict(False, f"node check failed on {said}: {done}", 1, tuple(healthy))
