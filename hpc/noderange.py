"""Node counts and node ranges of a stage: `stages.X.nodes=2` or `stages.X.nodes=2-4`.

    python -m hpc.submit langsplat --profile sandbox stages.features.nodes=1-2 --dry-run

A range is SLURM's own elasticity (sbatch --nodes=MIN-MAX): the job starts as soon as MIN nodes
are free, with as many up to MAX as there are then, and the session adapts to the world size it got
(global batch kept by re-planning gradient accumulation, hpc.batching). submitit counts a job's tasks
from an integer node count, so it is given MIN and the range itself travels as an sbatch option.
Pure: no torch, no scheduler.
"""
from __future__ import annotations

import re
from typing import Any, Tuple

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
