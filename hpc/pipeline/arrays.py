"""How one stage's items become sbatch arrays: at most MaxArraySize tasks each, and, for a stage
that waits item by item (StageDef.per_item_after), arrays whose task ids are those of the tasks
they wait for, so that SLURM's aftercorr pairs the right ones.

    parts((0, 1, 2), {0: ("features", 0), 1: ("features", 1), 2: None}, max_size=1001)
    # -> [Part((0, 1), (("features", 0), ("features", 1))), Part((2,), (None,))]

`aftercorr:J` starts task k of the dependent array once task k of array J has completed
successfully: SLURM pairs tasks by id, not by item. submitit numbers an array's tasks 0..n-1 in
submission order, so items make one dependent array only when they sit at ids 0..n-1 of one array
J. Items that do not (a partial resubmission left them at other ids of an earlier array) are
submitted one job each, afterok on exactly their own task. Pure: the planner calls parts(), the
submitter dependency() with the job ids it got.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from hpc.rundir.run import task_key

# Where an item's upstream task is: (label of an array submitted now, its task id there), the job
# id of a task still queued from an earlier submission ("12_3", or "12" for a one-task submission),
# or None: nothing to wait for (done, or skipped).
Ref = Union[Tuple[str, int], str, None]


@dataclass(frozen=True)
class Part:
    """One submission: its items, and per item the task it waits for (all None: no wait)."""

    items: Tuple[Any, ...]
    waits: Tuple[Ref, ...]


def chunks(items: Sequence[Any], max_size: Optional[int]) -> List[Tuple[Any, ...]]:
    """`items` in order, in pieces of at most `max_size` (None: one piece)."""
    size = max_size or len(items) or 1
    return [tuple(items[i:i + size]) for i in range(0, len(items), size)]


def parts(todo: Sequence[Any], where: Mapping[Any, Ref], max_size: Optional[int] = None) -> List[Part]:
    """Split `todo` into submissions: items waiting on no task in arrays of at most `max_size`;
    items waiting on tasks 0..n-1 of one array as one array in that order (aftercorr); every other
    item alone (afterok on its task)."""
    groups: Dict[Any, List[Tuple[Any, Ref]]] = {}
    for item in todo:
        ref = where.get(item)
        groups.setdefault(_array(ref), []).append((item, ref))
    out: List[Part] = []
    for array, members in groups.items():
        if array is None:
            out += [Part(c, (None,) * len(c)) for c in chunks([i for i, _ in members], max_size)]
            continue
        members.sort(key=lambda m: _task(m[1]))
        aligned = [_task(r) for _, r in members] == list(range(len(members)))
        if len(members) > 1 and aligned and len(members) <= (max_size or len(members)):
            out.append(Part(tuple(i for i, _ in members), tuple(r for _, r in members)))
        else:
            out += [Part((i,), (r,)) for i, r in members]
    return out


def locate(key: Any, placed: Mapping[Any, Ref], queued: Any) -> Ref:
    """Where the task `key` is: submitted now (`placed`), queued from an earlier submission
    (`queued`: key -> job id), or None."""
    if key in placed:
        return placed[key]
    if key not in queued:
        return None
    assert isinstance(queued, Mapping), "a per-item wait needs the job ids of the queued tasks"
    return queued[key]


def dependency(part: Part, upstream: str, ids: Optional[Mapping[str, Sequence[str]]] = None
               ) -> Tuple[Optional[str], List[List[str]]]:
    """The --dependency term of `part` ('aftercorr:J' for an array, 'afterok:J_k' for one item,
    None when it waits on nothing) and, per item, the job id it waits for. `ids`: label -> job ids
    of the arrays submitted now; None renders placeholders (the dry run)."""
    if all(r is None for r in part.waits):
        return None, [[] for _ in part.items]
    resolved = [_job_id(r, ids) for r in part.waits]
    if len(part.items) == 1:
        return f"afterok:{resolved[0] or '<' + task_key(upstream, part.items[0]) + '>'}", [[resolved[0] or ""]]
    assert len({_array(r) for r in part.waits}) == 1, part  # parts() made it: tasks 0..n-1 of one array
    first = resolved[0]
    return f"aftercorr:{first.split('_')[0] if first else '<' + part.waits[0][0] + '>'}", [[j or ""] for j in resolved]


def _array(ref: Ref) -> Any:
    if ref is None:
        return None
    return ("now", ref[0]) if isinstance(ref, tuple) else ("queued", ref.split("_")[0])


def _task(ref: Ref) -> int:
    """The task id of `ref` in its array (-1 for a job that is no array)."""
    if isinstance(ref, tuple):
        return ref[1]
    _, sep, task = str(ref).partition("_")
    return int(task) if sep and task.isdigit() else -1


def _job_id(ref: Ref, ids: Optional[Mapping[str, Sequence[str]]]) -> Optional[str]:
    if isinstance(ref, str):
        return ref
    if ref is None or ids is None:
        return None
    return ids[ref[0]][ref[1]]
