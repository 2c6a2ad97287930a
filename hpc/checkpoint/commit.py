"""Rank 0's renames in a checkpoint store: a written step committed, a killed writer's half-done
renames finished, and only the newest `keep` valid checkpoints kept.

    commit.swap_in(directory, 120, tmp)          # .step-120.tmp/ (its marker written) becomes step-120/
    said = commit.recover(directory)             # before the first write: what a killed writer left, finished
    commit.prune(directory, 120, keep, problem)  # older and invalid checkpoints go; a leased one stays

Every change is a rename inside the directory (hpc.checkpoint.layout names the entries), which
readers see whole; a step a reader holds a lease on (hpc.checkpoint.read_lease) is not removed.
The writer (hpc.checkpoint.store) calls these under its lock (hpc.checkpoint.writer_lock).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

from hpc.checkpoint import layout, read_lease
from hpc.checkpoint.layout import MARKER
from hpc.checkpoint.reader import warn_user
from hpc.fs.atomic import fsync_dir


def swap_in(directory: Path, step: int, tmp: Path) -> None:
    """Rename a temporary directory holding a verified marker to step-N. An existing step-N
    (the same step saved again after resuming from an older one) is first renamed to
    .step-N.old: a kill between the two renames leaves both, and recover() finishes the job."""
    final = directory / layout.name("step", step)
    if os.path.lexists(final):
        old = directory / layout.name("old", step)
        layout.discard(old)
        os.replace(final, old)
        os.replace(tmp, final)
        layout.discard(old)
    else:
        os.replace(tmp, final)
    fsync_dir(directory)


def recover(directory: Path) -> list[str]:
    """Rank 0, under the lock, before its first write: finish what a killed writer left half
    done. Returns what was found, in words, for a warning."""
    found, said = layout.scan(directory), []
    for step in sorted(set(found["tmp"]) | set(found["old"])):
        tmp, old = found["tmp"].get(step), found["old"].get(step)
        final = directory / layout.name("step", step)
        if tmp is not None and (tmp / MARKER).exists() and not layout.check(tmp, crc=())[0]:
            swap_in(directory, step, tmp)
            said.append(f"finished the commit of checkpoint step {step}: {tmp} was complete "
                        "(its marker verifies) but the writer was stopped before renaming it")
        elif old is not None and not os.path.lexists(final) and not layout.check(old, crc=())[0]:
            os.replace(old, final)
            said.append(f"restored {final} from {old}: a re-save of step {step} was stopped "
                        "between its two renames, before the new copy was complete")
        if old is not None:
            layout.remove(old)
    for path in found["gone"].values():
        layout.discard(path)
    return said


def prune(directory: Path, committed: int, keep: int, problem: Callable[[int, Path], str]) -> None:
    """Keep the newest `keep` valid checkpoints (and the one just committed). An invalid step-N
    never counts: it is set aside as .step-N.invalid with a warning, and deleted once `keep`
    valid checkpoints newer than it exist, so a run of broken directories can neither push
    out the good ones nor fill the disk."""
    found = layout.scan(directory)
    kept: list[int] = []
    for step in sorted(found["step"], reverse=True):
        path = found["step"][step]
        if len(kept) >= keep and step != committed:
            with read_lease.exclusive(directory, step) as free:
                if free:  # else a reader holds a lease: kept until a later save
                    layout.remove(path)
            continue
        trouble = problem(step, path)
        if not trouble:
            kept.append(step)
            continue
        where = layout.set_aside(path, step)
        warn_user(f"set aside checkpoint {path} as {where.name}: {trouble}; it does not count "
                  f"toward keep={keep} and goes once {keep} newer valid ones exist")
    for step, path in found["invalid"].items():
        if sum(k > step for k in kept) >= keep:
            layout.remove(path)
    # Temporary dirs of steps before the one just committed are leftovers of killed writes:
    # every rank has finished them (rank 0 commits only after all ranks wrote).
    for step, path in found["tmp"].items():
        if step < committed:
            layout.remove(path)
    for path in found["gone"].values():
        layout.discard(path)
