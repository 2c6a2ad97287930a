"""How one stage's items become sbatch arrays: at most MaxArraySize tasks each, and, for a stage
that waits item by item (StageDef.per_item_after), arrays whose task ids are those of the tasks
they wait for, so that SLURM's aftercorr pairs the right ones.

    parts((0, 1, 2), {0: ("features", 0), 1: ("features", 1), 2: None}, max_size=1001)
    # -> [Part((0, 1), (("features", 0), ("features", 1)), (0, 1)), Part((2,), (None,), (0,))]
    spec((3, 7, 12, 13, 14), 2)  # -> '3,7,12-14%2': sbatch --array with explicit task ids

`aftercorr:J` starts task k of the dependent array once task k of array J has completed
successfully: SLURM pairs tasks by id, not by item (a task with no task k in J would wait for the
whole of J). So the items waiting on tasks of one array J are submitted as one array whose task
ids are theirs in J, rendered as an explicit list (`--array=500-999`, `--array=3,7,12-20%4`):
any subset of J, a partial resubmission's included, stays one array with aftercorr and its %N.
Those ids are below MaxArraySize, as J's are. Items waiting on the same task (several items of one
sweep point after the point's one task) go to as many arrays as the most items on one task. Only
an item alone in its array, or waiting on a job that is no array, is submitted as one job, afterok
on exactly its task. Pure: the planner calls parts(), the submitter dependency() with the job ids
it got.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from hpc import Record
from hpc.rundir.run import task_key


@dataclass(eq=False, repr=False)
class Several(Record):
    """A packed group (hpc.pipeline.packing) whose items wait on several tasks: one job, afterok on each."""

    refs: Tuple[Union[Tuple[str, int], str], ...]


# Where an item's upstream task is: (label of an array submitted now, its task id there), the job
# id of a task still queued from an earlier submission ("12_3", or "12" for a one-task submission),
# None: nothing to wait for (done, or skipped), or Several such tasks (a packed group).
Ref = Union[Tuple[str, int], str, None, Several]
# submitit's own numbering when none is given (--array=0-N%P); SLURM's default MaxArraySize
PARALLELISM = 256


@dataclass(eq=False, repr=False)
class Part(Record):
    """One submission: its items, per item the task it waits for (all None: no wait), and per item
    its task id in the array (() : 0..n-1, submitit's numbering)."""

    items: Tuple[Any, ...]
    waits: Tuple[Ref, ...]
    ids: Tuple[int, ...] = ()

    @property
    def task_ids(self) -> Tuple[int, ...]:
        return self.ids or tuple(range(len(self.items)))


def chunks(items: Sequence[Any], max_size: Optional[int]) -> List[Tuple[Any, ...]]:
    """`items` in order, in pieces of at most `max_size` (None: one piece)."""
    size = max_size or len(items) or 1
    return [tuple(items[i:i + size]) for i in range(0, len(items), size)]


def parts(todo: Sequence[Any], where: Mapping[Any, Ref], max_size: Optional[int] = None) -> List[Part]:
    """Split `todo` into submissions: items waiting on no task in arrays of at most `max_size`;
    items waiting on tasks of one array as arrays at those tasks' ids (aftercorr), one array per
    item sharing a task; an item alone, or waiting on a job that is no array, as one job."""
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
        fits = [0 <= _task(r) < (max_size or _task(r) + 1) for _, r in members]
        alone = [m for m, ok in zip(members, fits) if not ok]
        layers: List[List[Tuple[Any, Ref]]] = []
        for member in (m for m, ok in zip(members, fits) if ok):
            free = next((layer for layer in layers if _task(layer[-1][1]) != _task(member[1])), None)
            layers.append([member]) if free is None else free.append(member)
        alone += [layer[0] for layer in layers if len(layer) == 1]
        out += [Part(tuple(i for i, _ in layer), tuple(r for _, r in layer), _ids([_task(r) for _, r in layer]))
                for layer in layers if len(layer) > 1]
        out += [Part((i,), (r,)) for i, r in sorted(alone, key=lambda m: _task(m[1]))]
    return out


def spec(ids: Sequence[int], parallelism: Optional[int] = None) -> str:
    """sbatch's --array value for these task ids (ascending): runs as ranges, then %parallelism."""
    runs: List[List[int]] = []
    for t in ids:
        if runs and t == runs[-1][1] + 1:
            runs[-1][1] = t
        else:
            runs.append([t, t])
    text = ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)
    return f"{text}%{min(len(ids), parallelism or PARALLELISM)}"


def task_ids(text: str) -> List[int]:
    """The task ids of an --array value (spec()'s inverse; SLURM's own '0-9:2' steps included)."""
    out: List[int] = []
    for run in text.partition("%")[0].split(","):
        bounds, _, step = run.partition(":")
        lo, _, hi = bounds.partition("-")
        out += range(int(lo), int(hi or lo) + 1, int(step or 1))
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


def dependency(part: Part, upstream: str, ids: Optional[Mapping[str, Sequence[str]]] = None,
               up_item: Any = None) -> Tuple[Optional[str], List[List[str]]]:
    """The --dependency term of `part` ('aftercorr:J' for an array, 'afterok:J_k' for one item,
    None when it waits on nothing) and, per item, the job id it waits for. `ids`: label -> job ids
    of the arrays submitted now, in task id order; None renders placeholders (the dry run), which
    name the item of `upstream` waited for (`up_item` maps an item to it; None: the same item)."""
    if all(r is None for r in part.waits):
        return None, [[] for _ in part.items]
    if isinstance(part.waits[0], Several):  # parts() submits such a group alone
        jobs = [_job_id(r, ids) for r in part.waits[0].refs]
        return "afterok:" + ":".join(j or f"<{r[0]}_{r[1]}>" for j, r in zip(jobs, part.waits[0].refs)), [
            [j or "" for j in jobs]]
    resolved = [_job_id(r, ids) for r in part.waits]
    if len(part.items) == 1:
        name = task_key(upstream, (up_item or (lambda i: i))(part.items[0]))
        return f"afterok:{resolved[0] or '<' + name + '>'}", [[resolved[0] or ""]]
    assert len({_array(r) for r in part.waits}) == 1, part  # parts() made it: tasks of one array
    first = resolved[0]
    return f"aftercorr:{first.split('_')[0] if first else '<' + part.waits[0][0] + '>'}", [[j or ""] for j in resolved]


def order(ref: Ref) -> Tuple[str, int]:
    """A sort key placing items that wait on one array together, by task id (None first)."""
    return (str(_array(ref) or ""), _task(ref))


def _ids(ids: List[int]) -> Tuple[int, ...]:
    """() where the ids are submitit's own 0..n-1."""
    return () if ids == list(range(len(ids))) else tuple(ids)


def _array(ref: Ref) -> Any:
    if ref is None:
        return None
    if isinstance(ref, Several):
        return ("several", ref.refs)
    return ("now", ref[0]) if isinstance(ref, tuple) else ("queued", ref.split("_")[0])


def _task(ref: Ref) -> int:
    """The task id of `ref` in its array (-1 for a job that is no array)."""
    if isinstance(ref, tuple):
        return ref[1]
    if isinstance(ref, Several):
        return -1
    _, sep, task = str(ref).partition("_")
    return int(task) if sep and task.isdigit() else -1


def _job_id(ref: Ref, ids: Optional[Mapping[str, Sequence[str]]]) -> Optional[str]:
    if isinstance(ref, str):
        return ref
    if ref is None or ids is None:
        return None
    jids = ids[ref[0]]
    if len(jids) == 1 and "_" not in jids[0]:  # a one-task submission is no array in submitit
        return jids[0]
    return f"{jids[0].split('_')[0]}_{ref[1]}"
