"""Reliability: every fault campaign once, the faults injected by kind and what they lost.

    python -m faults.reliability                 # every campaign with its full count, writes RELIABILITY.md
    python -m faults.reliability --quick --out /tmp/R.md

The campaigns are faults.checkpoint, faults.disk, faults.resume, faults.exits (normal exits of
DDP jobs on a local SLURM cluster), faults.hangs (hung ranks and the watchdog), faults.inplace (ranks
killed or hung again and again in one job, restarted in place each time), faults.sharedfs
(NFS and Lustre behaviours, injected), faults.nodefail (a node of a local SLURM cluster failed
under a 2-node training job, which hpc requeues without it), faults.controller (a preemption whose
`scontrol requeue` times out: the job keeps its place), faults.submitfaults (sbatch answers lost
after queueing, squeue answering nothing while slurmdbd is down: each task queued once), faults.outages
(the local cluster's slurmctld restarted mid-training, its slurmdbd stopped for a minute),
faults.qoslimits (a QOS submit limit set with sacctmgr) and, for run directories,
tests.submit_race (simultaneous submissions into one run dir). "Lost" counts checkpoints that were
committed and then did not load (or loads that raised, returned nothing or mixed two checkpoints),
resumed runs that did not end bitwise equal to the uninterrupted one, second writers let in,
manifest entries missing after concurrent submissions, and jobs whose node failed that did not
finish from their newest checkpoint, off the node, with the uninterrupted model. A campaign that
cannot run here (no tmpfs can be mounted) is listed as not run, with the reason; it is never
counted as passed.
"""
from __future__ import annotations

import argparse
import logging
import sys
import time
import warnings
from pathlib import Path
from typing import Callable, Dict, List, NamedTuple, Optional, Sequence

from bench.common import REPO, Context
from bench.report import Section, machine, render_section, stamp
from faults.common import Outcome

TITLE = "Reliability under injected faults"
TARGET = "0 checkpoints and 0 manifest entries lost"
SEED = 0


class Campaign(NamedTuple):
    kind: str  # the faults, in words
    run: Callable[[Path, int, int], Outcome]  # (scratch, count, seed) -> Outcome
    count: int
    quick: int


def _sigkill(mode: str) -> Callable[[Path, int, int], Outcome]:
    from faults.checkpoint import sigkill_saves

    return lambda scratch, n, seed: sigkill_saves(scratch, n, seed, mode)


def _submissions(scratch: Path, rounds: int, seed: int) -> Outcome:
    from tests.submit_race import race

    submitters = 3
    done, expected, lost = race(rounds=rounds, submitters=submitters, root=scratch)
    return Outcome(done * submitters, lost,
                   f"{done} rounds of {submitters} simultaneous submissions of a 4-task pipeline into "
                   f"one new run dir; {expected} manifest entries expected")


def _normal_exits(workload: str):
    def campaign(scratch: Path, count: int, seed: int) -> Outcome:
        from faults.exits import normal_exits

        return normal_exits(scratch, count, seed, workload)
    return campaign


def campaigns() -> List[Campaign]:
    from faults import checkpoint as fc
    from faults import sharedfs as fs
    from faults.controller import requeue_timeouts
    from faults.disk import full_disk
    from faults.hangs import hung_ranks
    from faults.inplace import repeated_restarts
    from faults.nodefail import node_failures
    from faults.outages import ctld_restarts, dbd_outage
    from faults.qoslimits import qos_limits
    from faults.resume import dropout_resume
    from faults.submitfaults import empty_squeue, queued_then_timeout
    from faults.teardown import script_exits

    return [
        Campaign("SIGKILL during saves, thread writer", _sigkill("thread"), 60, 4),
        Campaign("SIGKILL during saves, forked writer", _sigkill("fork"), 60, 4),
        Campaign("SIGKILL during saves, blocking save", _sigkill("blocking"), 60, 4),
        Campaign("SIGKILL at the two renames of a re-saved step", fc.kill_between_renames, 27, 9),
        Campaign("full disk (ENOSPC) during a save", full_disk, 15, 3),
        Campaign("load() while a keep=1 writer prunes", fc.readers_during_prune, 3000, 100),
        Campaign("second writer into a live store, then its holder SIGKILLed", fc.two_writers, 10, 2),
        Campaign("malformed step-N entries", fc.malformed_entries, 100, 10),
        Campaign("dropout + augmentation run SIGTERMed or SIGKILLed, then resumed",
                 dropout_resume, 10, 2),
        Campaign("concurrent submissions into one run dir", _submissions, 9, 2),
        Campaign("normal exits of a 2 x 2 DDP job under srun --kill-on-bad-exit", _normal_exits("ddp"), 200, 4),
        Campaign("normal exits of a 2 x 2 TrainLoop job under DDP, srun --kill-on-bad-exit",
                 _normal_exits("trainloop-ddp"), 200, 4),
        Campaign("normal exits of a 2 x 2 TrainLoop job under FSDP (DCP's second group), srun --kill-on-bad-exit",
                 _normal_exits("trainloop-fsdp"), 200, 4),
        Campaign("scripts ending without destroy_process_group(), under the run wrapper's exit", script_exits,
                 100, 2),
        Campaign("a rank hung (SIGSTOP, or asleep in its step): watchdog", hung_ranks, 10, 2),
        Campaign("a node failed under a 2-node training job: requeued without it", node_failures, 5, 1),
        Campaign("a rank killed or hung 3 times in one job: restarted in place each time", repeated_restarts, 3, 1),
        Campaign("requeue timing out at a preemption (scontrol requeue: Socket timed out, 1 or 2 times)",
                 requeue_timeouts, 5, 1),
        Campaign("sbatch queued, then timed out (or timed out before queueing)", queued_then_timeout, 10, 5),
        Campaign("squeue answering nothing, then a resubmission (slurmdbd down)", empty_squeue, 3, 1),
        Campaign("slurmctld stopped and started again mid-training, then a preemption or the time-limit warning",
                 ctld_restarts, 4, 2),
        Campaign("slurmdbd stopped for a minute under a run: status and resubmissions meanwhile", dbd_outage, 3, 1),
        Campaign("a QOS submit limit set with sacctmgr: a run past it, a run within it", qos_limits, 4, 1),
        Campaign("shared FS: directory fsync answers EINVAL", fs.dir_fsync_einval, 30, 4),
        Campaign("shared FS: NFS negative lookup cache while rank 0 commits", fs.negative_cache, 20, 3),
        Campaign("shared FS: checkpoint pruned after an NFS load", fs.pruned_after_load, 20, 3),
        Campaign("shared FS: flock answers ENOLCK", fs.no_locks, 20, 3),
    ]


def earlier_rows(report: Path) -> Dict[str, List[str]]:
    """The rows of an earlier RELIABILITY.md by their kind (the total row left out), and its date line."""
    try:
        lines = report.read_text().splitlines()
    except OSError:
        return {}
    rows = {}
    for line in lines:
        cols = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| ") and len(cols) == 5 and cols[0] not in ("faults", "**total**"):
            rows[cols[0]] = cols
    own_date = next((ln for ln in lines if ln.startswith("Produced by")), "")
    # rows that report carried over itself keep the date of the oldest run that measured them; the
    # next report names that and the report itself, the last that may have measured some of them
    carried = next((ln for ln in lines if "carried over from the earlier report" in ln and "(produced by" in ln), "")
    oldest = own_date
    if carried:
        oldest = "Produced by" + carried.split("(produced by", 1)[1].split("):", 1)[0].split("; the last report", 1)[0]
    return {**rows, "": [oldest, own_date]} if rows else {}


def run(ctx: Context, seed: int = SEED, only: Sequence[str] = (), earlier: Optional[Dict[str, List[str]]] = None,
        command: str = "", progress: Optional[Callable[[Section], None]] = None) -> Section:
    """Every campaign, or with `only` those whose kind holds one of its words; the others' rows
    are then carried over from `earlier` (earlier_rows), and a note says from when. `progress` gets
    the report so far after each campaign that ran (those still to run say so): a run stopped
    part-way keeps the figures of the campaigns it finished."""
    command = command or "python -m faults.reliability" + (" --quick" if ctx.quick else "")
    sec = Section("reliability", TITLE, TARGET, command,
                  headers=["faults", "injected", "lost", "seconds", "what was checked"])
    injected = lost = 0
    not_run, carried = [], []
    hpc_log = logging.getLogger("hpc")
    level = hpc_log.level
    hpc_log.setLevel(logging.ERROR)  # the store warns about every entry it skips: expected here
    every = campaigns()
    try:
        for i, c in enumerate(every):
            if only and not any(word in c.kind for word in only):
                row = (earlier or {}).get(c.kind.replace("|", "/"))
                if row is None:
                    sec.rows.append([c.kind, "not run", "-", "-",
                                     "not selected by --only, and not in the earlier report"])
                    not_run.append(c.kind)
                    continue
                sec.rows.append(row)
                carried.append(c.kind)
                if row[1].isdigit() and row[2].isdigit():
                    injected, lost = injected + int(row[1]), lost + int(row[2])
                else:
                    not_run.append(c.kind)
                continue
            t0 = time.perf_counter()
            print(f"campaign: {c.kind} ({c.quick if ctx.quick else c.count})", flush=True)
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    out = c.run(ctx.scratch(f"reliability-{i}"), c.quick if ctx.quick else c.count, seed)
            except Exception as err:  # reported as not run, with the reason: never as passed
                reason = (str(err).strip().splitlines() or [type(err).__name__])[-1]
                sec.rows.append([c.kind, "not run", "-", f"{time.perf_counter() - t0:.1f}", reason])
                not_run.append(c.kind)
                continue
            injected, lost = injected + out.faults, lost + out.lost
            sec.rows.append([c.kind, str(out.faults), str(out.lost), f"{time.perf_counter() - t0:.1f}",
                             out.detail.replace("|", "/")])
            if progress is not None and i + 1 < len(every):
                progress(_so_far(sec, every[i + 1:], only, earlier, injected, lost, not_run, carried, command, seed))
    finally:
        hpc_log.setLevel(level)
    return _finish(sec, injected, lost, not_run, carried, earlier, command, seed)


def _so_far(sec: Section, rest: List[Campaign], only: Sequence[str], earlier: Optional[Dict[str, List[str]]],
            injected: int, lost: int, not_run: List[str], carried: List[str], command: str, seed: int) -> Section:
    """The report as it stands: the campaigns still to run are marked so, the unselected carried over."""
    part = Section(sec.name, sec.title, sec.target, sec.command, headers=list(sec.headers), rows=list(sec.rows))
    not_run, carried = list(not_run), list(carried)
    for c in rest:
        row = (earlier or {}).get(c.kind.replace("|", "/")) if only and not any(w in c.kind for w in only) else None
        if row is not None and row[1].isdigit() and row[2].isdigit():
            part.rows.append(row)
            carried.append(c.kind)
            injected, lost = injected + int(row[1]), lost + int(row[2])
        else:
            part.rows.append([c.kind, "not run", "-", "-", "still to run when this report was written"])
            not_run.append(c.kind)
    return _finish(part, injected, lost, not_run, carried, earlier, command, seed)


def _finish(sec: Section, injected: int, lost: int, not_run: List[str], carried: List[str],
            earlier: Optional[Dict[str, List[str]]], command: str, seed: int) -> Section:
    sec.rows.append(["**total**", f"**{injected}**", f"**{lost}**", "", ""])
    sec.verdicts.append((f"{lost} lost over {injected} injected faults", lost == 0))
    sec.verdicts.append(("every campaign ran" + (f" (not run: {', '.join(not_run)})" if not_run else ""),
                         not not_run))
    if carried:
        dates = [d.replace("Produced by", "produced by").rstrip(". ") for d in (earlier or {}).get("", [""])]
        when = dates[0] if len(set(dates)) < 2 else f"{dates[0]}; the last report before this one {dates[-1]}"
        sec.notes.append(f"{len(carried)} rows are carried over from the earlier report ({when}): "
                         f"`{command}` reran only the others")
    sec.notes += [
        "lost: a committed checkpoint that did not load afterwards; a load that raised, returned "
        "None once a checkpoint existed, or mixed files of two steps; a resumed run whose parameters "
        "are not torch.equal to the uninterrupted run's; a second writer let in; a manifest entry missing; "
        "a run script's rank that ended normally and was counted as failed; "
        "a job whose node failed that did not end COMPLETED off the node, resumed from its newest "
        "checkpoint, with the uninterrupted run's model (within 1e-12: 4 ranks became 2); a job restarted in place "
        "that was requeued, missed a restart, trained a step twice or not at all, or ended with another model; a preempted job whose "
        "requeue timed out that did not end COMPLETED with every step done, submitted once and restarted once; "
        "a task with no queued job, queued twice, recorded under another id than squeue's, or submitted again "
        "blindly (a resubmission that squeue answered nothing for twice must refuse); for a daemon stopped or a "
        "QOS limit: a run lost, a job submitted twice (an sbatch of a refused run included) or a task rerun "
        "after completing, a stop record that does not say the job was requeued, a status slower than 15 s "
        "or wrong while slurmdbd is down, a refusal that is not one line naming the limit",
        f"seed {seed}; victims are forked and their whole process group SIGKILLed, as SLURM kills a "
        "job; the full disk is an 8 MiB tmpfs filled by a ballast file",
        "the same campaigns run with small counts in tests/test_checkpoint_faults.py and "
        "tests/test_submit_concurrent.py"]
    return sec


def render(sec: Section, command: str, started: float, info: dict) -> str:
    head = ["# Reliability", "",
            f"Produced by `{command}` on {stamp(started, info)}.  ",
            f"Machine: {info['cores']} cores, {info['cpu']}, {info['mem_gib']} GiB RAM, Python "
            f"{info['python']}, Linux {info['kernel']}.", ""]
    body = render_section(1, sec)
    body[0] = f"## {sec.title}"
    return "\n".join(head + body).rstrip() + "\n"


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m faults.reliability", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="small counts: a smoke test, not figures to keep")
    p.add_argument("--seed", type=int, default=SEED)
    p.add_argument("--keep", action="store_true", help="leave the scratch directory (the logs of what was lost)")
    p.add_argument("--out", help=f"report path (default {REPO / 'RELIABILITY.md'}; with --quick "
                   f"{REPO / 'RELIABILITY-quick.md'})")
    p.add_argument("--only", nargs="+", action="extend", default=[], metavar="WORDS",
                   help="run only the campaigns whose name holds one of these words (e.g. 'normal exits'; "
                        "repeat --only for more); the other rows are carried over from the report being replaced")
    args = p.parse_args(argv)
    out = Path(args.out or REPO / ("RELIABILITY-quick.md" if args.quick else "RELIABILITY.md"))
    command = "python -m faults.reliability" + (" --quick" if args.quick else "") + \
        (f" --seed {args.seed}" if args.seed != SEED else "") + \
        "".join(f" --only '{w}'" for w in args.only)
    started, info = time.time(), machine()
    t0 = time.perf_counter()
    with Context(quick=args.quick, keep=args.keep) as ctx:
        if args.keep:
            print(f"scratch directory, kept: {ctx.tmp}", flush=True)
        def keep(part: Section) -> None:
            part.seconds = time.perf_counter() - t0
            out.write_text(render(part, command, started, info))
            print(f"wrote {out} so far: {part.outcome}", flush=True)

        sec = run(ctx, args.seed, args.only, earlier_rows(out) if args.only else None, command, keep)
    sec.command, sec.seconds = command, time.perf_counter() - t0
    out.write_text(render(sec, command, started, info))
    print(f"wrote {out}: {sec.outcome}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
