"""Node counts and node ranges of a stage: `stages.X.nodes=2` or `stages.X.nodes=2-4`.

    python -m hpc.submit langsplat --profile sandbox stages.features.nodes=1-2 --dry-run

A range is SLURM's own elasticity (sbatch --nodes=MIN-MAX): the job starts as soon as MIN nodes
are free, with as many up to MAX as there are then, and the session adapts to the world size it got
(global batch kept by re-planning gradient accumulation, hpc.runtime.batching). submitit counts a job's tasks
from an integer node count, so it is given MIN and the range itself travels as an sbatch option.
Pure: no torch, no scheduler.
"""
from __future__ import annotations

import math
import re
from typing import Any, Optional, Tuple

_RANGE = re.compile(r"([0-9]+)-([0-9]+)")  # ASCII digits only: \d would take any script's digits
_COUNT = re.compile(r"([0-9]+)")


class NodeRangeError(ValueError):
    """A node count or range that cannot be requested; the message has a HINT."""


def parse(value: Any, where: str, limits: Tuple[int, int]) -> Tuple[int, int]:
    """(MIN, MAX) of an int or of "N" / "MIN-MAX" text, both within `limits` (inclusive).
    `where` names the setting in the message (e.g. stages.features.nodes)."""
    low, high = limits
    if isinstance(value, bool):  # True is an int to Python, not a node count
        value = str(value)
    if isinstance(value, int):
        lo = hi = value
    else:
        text = str(value)
        found = _RANGE.fullmatch(text) or _COUNT.fullmatch(text)
        if not found:
            raise NodeRangeError(f"{where}={text!r} is neither a node count nor a range; expected an integer "
                                 f"or MIN-MAX (e.g. 2-4). HINT: set {where}=2 or {where}=2-4.")
        lo, hi = int(found.group(1)), int(found.group(found.lastindex or 1))
    if lo > hi:
        raise NodeRangeError(f"{where}={lo}-{hi} has its minimum above its maximum; expected MIN <= MAX. "
                             f"HINT: set {where}={hi}-{lo}.")
    if lo < low:
        raise NodeRangeError(f"{where}={show((lo, hi))} asks for fewer than {low} node(s); expected "
                             f"{low} to {high}. HINT: set {where}={show((low, max(hi, low)))}.")
    if hi > high:
        raise NodeRangeError(f"{where}={show((lo, hi))} is above hpc's limit of {high} nodes; expected "
                             f"{low} to {high}. HINT: set {where} to a real request.")
    return lo, hi


def show(bounds: Tuple[int, int]) -> str:
    """'2' for a fixed count, '2-4' for a range: what sbatch --nodes takes."""
    lo, hi = bounds
    return str(lo) if lo == hi else f"{lo}-{hi}"


def bounds(value: Any) -> Tuple[int, int]:
    """(MIN, MAX) of a value the config has already checked."""
    return parse(value, "nodes", (1, 1 << 62))


def first_uneven(global_batch: int, tasks_per_node: int, nodes: Tuple[int, int]) -> Optional[int]:
    """The fewest nodes in the range whose world size (nodes x tasks_per_node) the global batch does
    not split over; None when it splits over every one. Cheap for any range: no world above the
    batch divides it, so at most global_batch // tasks_per_node counts are tried (and a run of
    consecutive counts that all divide ends within a few steps, their lcm grows that fast)."""
    lo, hi = nodes
    fits = global_batch // tasks_per_node  # the most nodes whose world can still divide the batch
    for count in range(lo, min(hi, fits) + 1):
        if global_batch % (count * tasks_per_node):
            return count
    return None if hi <= fits else max(lo, fits + 1)


def check_batch(where: str, nodes: Tuple[int, int], tasks_per_node: int, global_batch: int) -> None:
    """Refuse a node count or range when SLURM may grant a node count whose world size the global
    batch does not split over: the job would die only after its wait in the queue."""
    tasks, (lo, hi) = tasks_per_node, nodes
    bad = first_uneven(global_batch, tasks, nodes)
    if bad is None:
        return
    got = f"= {bad * tasks} rank(s)" if lo == hi else f"may run on {bad} node(s) = {bad * tasks} rank(s)"
    inside = _longest_even_run(global_batch, tasks, nodes)
    run = inside or _longest_even_run(global_batch, tasks, (1, hi))
    fixes = [f"set {where}={show(run if lo < hi else (run[1], run[1]))}"] if run else []
    multiple = _lcm_capped(range(lo, hi + 1), tasks, cap=1 << 40)
    if multiple:
        worlds = "-".join(str(n * tasks) for n in sorted({lo, hi}))
        fixes.append(f"use a global batch of {_round_up(global_batch, multiple)} (a multiple of every world size "
                     f"in {worlds})")
    elif not inside:
        fixes.append(f"set {where}={lo} with a global batch of {_round_up(global_batch, lo * tasks)}")
    raise NodeRangeError(f"{where}={show(nodes)} x {tasks} task(s) {got}, and the global batch {global_batch} does "
                         f"not split over {bad * tasks}; expected a batch every world size of the request splits "
                         f"over. HINT: {' or '.join(fixes)}.")


def _round_up(value: int, step: int) -> int:
    return -(-value // step) * step


def _longest_even_run(global_batch: int, tasks_per_node: int, nodes: Tuple[int, int]) -> Optional[Tuple[int, int]]:
    """The longest range of node counts within `nodes` whose worlds all split the batch (most nodes
    on a tie); None when no count does."""
    best, start = None, None
    for count in range(nodes[0], min(nodes[1], global_batch // tasks_per_node) + 1):
        if global_batch % (count * tasks_per_node):
            start = None
            continue
        start = count if start is None else start
        if best is None or count - start >= best[1] - best[0]:
            best = (start, count)
    return best


def _lcm_capped(counts: range, factor: int, cap: int) -> Optional[int]:
    """factor x lcm(counts), or None once it passes `cap` (a batch no one would run)."""
    value = factor
    for count in counts:
        value = math.lcm(value, count * factor)
        if value > cap:
            return None
    return value
