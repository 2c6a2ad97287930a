"""Jobs hpc submitted but lost track of, found by their token; the work a run planned but never submitted.

    python -c "from hpc.monitor import lost; from hpc.rundir.run import RunDir; print(lost.look(RunDir('runs/x')).missing)"

A submission writes each sbatch's token down before it runs (hpc.rundir.intents) and forgets it once
the job ids are in the manifest. An announcement left behind (sbatch's answer and the look-up both
lost, or the submitting process killed in between) is looked up here: one `squeue --me` call for
all of them (hpc.slurm.tokens; a second only when the first answers nothing, which a loaded
controller may do), and none when nothing is pending. A job found is added to the run's manifest,
marked `found_by_token`: in memory for python -m hpc.status (look; look_sweep for a sweep's points),
written by a resubmission before it plans (settle), so that it never queues the work a second time. Either also does for it what the
submission would have done after sbatch (its log folder, its pickle: hpc.rundir.intents.complete;
status copies the pickle, as the submission it looks at may still be running and move it itself),
so that the job runs when it starts; one that started before anyone looked has failed (submitit waits
60 s for its pickle), and a resubmission submits its tasks again. An announcement no queued job
carries was never queued, or its job ended before slurmctld's MinJobAge: its tasks' done markers
tell what finished, and a resubmission submits the rest; one younger than IN_FLIGHT_S may still have
an sbatch on its way (a killed submission's sbatch goes on), so a resubmission waits for it.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Sequence

from hpc.rundir import intents
from hpc.rundir.run import RunDir, add_jobs, task_key
from hpc.slurm import tokens

IN_FLIGHT_S = 60.0  # how long an sbatch whose caller was killed may still be on its way (cli.run's timeout)
FOUND = "found by its token"


@dataclass
class Looked:
    run: RunDir  # pinned: its manifest (in memory) holds the jobs found by token
    settled: List[str] = field(default_factory=list)  # tokens whose jobs that manifest holds
    missing: List[Dict[str, Any]] = field(default_factory=list)  # announcements no queued job carries
    failed: str = ""  # squeue's error when the look-up got no answer


def look_up() -> Dict[str, str]:
    """token -> job id (an array's first) of every job of this user that slurmctld holds."""
    out = tokens.queued()
    return tokens.parse(out if out.strip() else tokens.queued())


def adopt(data: Dict[str, Any], pending: Sequence[Dict[str, Any]], found: Dict[str, str],
          move: bool = True) -> List[str]:
    """Add to the manifest `data`, in memory, the jobs `found` (token -> id) for the announcements
    `pending`; returns the tokens whose jobs `data` now holds (added now or recorded before).
    `move`: intents.complete's (False outside the submission lock)."""
    data.setdefault("tasks", {})
    data.setdefault("submissions", [])
    known = {j["job_id"] for t in data["tasks"].values() for j in t["jobs"]}
    settled = []
    for entry in pending:
        first = found.get(entry["token"])
        if first is None:
            continue
        intents.complete(entry, first, move)  # its log folder and pickle: the job may start any moment
        each = entry.get("each") or [()] * len(entry["items"])
        new = [(item, jid, waits) for item, jid, waits in zip(entry["items"], intents.job_ids(entry, first), each)
               if jid not in known]
        if new:
            add_jobs(data, entry["stage"], [(item, jid) for item, jid, _ in new], "slurm", entry.get("after") or (),
                     [waits for _, _, waits in new], entry.get("code"), token=entry["token"])
        settled.append(entry["token"])
    return settled


def look(run: RunDir) -> Looked:
    """The run (pinned) with the jobs of its pending announcements added in memory; no scheduler call
    when none is pending, and none for a run looked at already."""
    if isinstance(run, _Adopted):
        return run.looked
    run = run.pin()
    pending = intents.pending(run.path)
    if not pending:
        return Looked(run)
    try:
        found, failed = look_up(), ""
    except RuntimeError as err:  # the rows still show what the manifest knows, and say the look-up failed
        found, failed = {}, str(err).split(". HINT:")[0]
    return _looked(run, pending, found, failed)


def look_sweep(where: Path, points: Dict[str, RunDir]) -> Dict[str, Looked]:
    """look() for a sweep directory `where`, whose announcements name (point, item) pairs: each point
    (signature -> its run dir) pinned with the jobs found for its items added in memory. One squeue
    call for all points when the sweep has a pending announcement, none otherwise."""
    pending = intents.pending(where)
    parts = _by_point(pending) if pending else {}
    found, failed = {}, ""
    if parts:
        try:
            found = look_up()
        except RuntimeError as err:  # as look()'s
            failed = str(err).split(". HINT:")[0]
    return {sig: _looked(run, parts[sig], found, failed) if sig in parts else Looked(run.pin())
            for sig, run in points.items()}


def _looked(run: RunDir, pending: Sequence[Dict[str, Any]], found: Dict[str, str], failed: str) -> Looked:
    """The run pinned with the jobs `found` for its `pending` announcements added to a copy of its manifest."""
    adopted = _Adopted.at(run.path)
    adopted._pinned = copy.deepcopy(run.manifest())
    settled = adopt(adopted._pinned, pending, found, move=False)  # a submission may be under way
    adopted.looked = Looked(adopted, settled, [e for e in pending if e["token"] not in settled], failed)
    return adopted.looked


class _Adopted(RunDir):
    """A pinned run dir whose manifest holds the jobs found by token: look() of it is itself."""

    looked: Looked


def notes(looked: Looked) -> Dict[str, str]:
    """task key -> what hpc.status says of a task whose job was found by token, or whose latest sbatch
    hpc never heard the answer of and no queued job carries its token."""
    out = {task_key(t["stage"], t["item"]): f"{FOUND} {tokens.TAG}{t['jobs'][-1]['found_by_token']} "
           "(sbatch's answer was lost)" for t in looked.run.tasks() if t["jobs"][-1].get("found_by_token")}
    for entry in looked.missing:
        tag, age = f"{tokens.TAG}{entry['token']}", intents.age_s(entry)
        if looked.failed:
            said = f"sbatch's answer was lost and looking its token {tag} up failed ({looked.failed})"
        elif age < IN_FLIGHT_S:
            said = f"being submitted: sbatch started {age:.0f} s ago, no job carries its token {tag} yet"
        else:
            said = (f"sbatch's answer was lost and no job in the queue carries its token {tag}: never queued, or "
                    "ended longer than MinJobAge ago. HINT: submit again with --run-dir: done tasks are skipped")
        out.update({task_key(entry["stage"], item): said for item in entry["items"]})
    return out


def settle(run: RunDir) -> List[str]:
    """Before a resubmission plans (under its lock): write the jobs found for the run's pending
    announcements into its manifest and forget the announcements; returns one line per finding.
    Refuses (RuntimeError with a HINT) when squeue does not answer, or an sbatch may still be on its
    way: hpc never queues work whose submission it cannot see."""
    pending = intents.pending(run.path)
    if not pending:
        return []
    found = _found(run.path, pending)
    data = run.manifest()
    settled = adopt(data, pending, found) if data else []
    if settled:
        run.write_manifest(data)
    intents.drop(run.path, [e["token"] for e in pending])
    return _said(pending, found, settled)


def settle_sweep(where: Path, point: Callable[[str], RunDir]) -> List[str]:
    """settle() for a sweep directory `where`, whose announcements name (point, item) pairs: each job
    found goes into its points' manifests (`point`: signature -> its run dir)."""
    pending = intents.pending(where)
    if not pending:
        return []
    found = _found(where, pending)
    settled = set()
    for sig, parts in _by_point([e for e in pending if e["token"] in found]).items():
        run = point(sig)
        data = run.manifest() or {"pipeline": "", "submissions": [], "tasks": {}}  # killed before its first write
        settled.update(adopt(data, parts, found))
        run.write_manifest(data)
    intents.drop(where, [e["token"] for e in pending])
    return _said(pending, found, settled)


def _by_point(pending: Sequence[Dict[str, Any]]) -> Dict[str, List[Dict[str, Any]]]:
    """A sweep's announcements, each cut into one per point: its items, ids and waits of that point."""
    out: Dict[str, List[Dict[str, Any]]] = {}
    for entry in pending:
        each = entry.get("each") or [[]] * len(entry["items"])
        mine: Dict[str, List[int]] = {}
        for n, (sig, _) in enumerate(entry["items"]):
            mine.setdefault(sig, []).append(n)
        for sig, ns in mine.items():
            out.setdefault(sig, []).append({
                **entry, "items": [entry["items"][n][1] for n in ns], "ids": [entry["ids"][n] for n in ns],
                "each": [each[n] for n in ns], "after": (entry.get("after") or {}).get(sig, [])})
    return out


def _found(where: Path, pending: Sequence[Dict[str, Any]]) -> Dict[str, str]:
    """look_up() for a resubmission, which refuses when squeue does not answer or a token is too young."""
    try:
        found = look_up()
    except RuntimeError as err:
        raise RuntimeError(f"{len(pending)} earlier sbatch call(s) into {where} never got their answer, and "
                           f"looking their tokens up failed ({str(err).split('. HINT:')[0]}); expected squeue's "
                           "answer. HINT: submit again once `scontrol ping` answers; hpc does not queue work "
                           "twice (python -m hpc.status RUN_DIR shows what it knows)") from None
    young = [e for e in pending if e["token"] not in found and intents.age_s(e) < IN_FLIGHT_S]
    if young:
        raise RuntimeError(f"an sbatch into {where} for stage {young[0]['stage']} (token {tokens.TAG}"
                           f"{young[0]['token']}) started {intents.age_s(young[0]):.0f} s ago and no job carries its "
                           f"token yet; expected it queued or gone. HINT: submit again in {IN_FLIGHT_S:.0f} s: "
                           "an sbatch whose caller was killed may still be on its way")
    return found


def _said(pending: Sequence[Dict[str, Any]], found: Dict[str, str], settled: Any) -> List[str]:
    return [f"found by its token {tokens.TAG}{e['token']}: job {found[e['token']]}, stage {e['stage']} "
            f"({len(e['items'])} task(s)), whose sbatch answer was lost" for e in pending if e["token"] in settled]
