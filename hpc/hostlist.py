"""Expand SLURM hostlist expressions exactly as `scontrol show hostnames` does.

    python -c "from hpc.hostlist import expand; print(expand('gpu-a[001-003,010],gpu-b07'))"

Grammar (what Slurm 22.05 accepts): items separated by commas or whitespace at the top
level; an item is literal text with bracket groups `[1-3,7,010-012]`, each group preceded by
its own literal text. Zero padding takes the width of a range's low bound (`[007-10]` gives
007..010, `[1-010]` gives 1..10). Duplicates are kept and order is preserved, like scontrol.
Pure: no SLURM, no torch.
"""

from __future__ import annotations

import itertools
import math
import re

__all__ = ["expand", "HostlistError"]

_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")
# Literal text may not contain brackets or separators; an item is (text [group])* text?
_PIECE = re.compile(r"([^\[\],\s]*)\[([^\[\]]*)\]")

# Largest expansion we agree to build: a typo like n[1-99999999] must not eat the memory.
MAX_HOSTS = 1_000_000


class HostlistError(ValueError):
    """A hostlist expression that SLURM would reject too."""


def _fail(expr: str, what: str, hint: str) -> HostlistError:
    return HostlistError(
        f"invalid hostlist {expr!r}: {what}. Expected SLURM syntax such as "
        f"'gpu-a[001-003,010],gpu-b07'. HINT: {hint}"
    )


def _split_items(expr: str) -> list[str]:
    """Split at commas/whitespace that are outside brackets."""
    items, depth, cur = [], 0, []
    for ch in expr:
        if ch == "[":
            depth += 1
            if depth > 1:
                raise _fail(expr, "nested '['", "close each bracket group before opening another")
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise _fail(expr, "']' without '['", "remove the stray ']'")
        if depth == 0 and (ch == "," or ch.isspace()):
            items.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if depth:
        raise _fail(expr, "unclosed '['", "add the missing ']'")
    items.append("".join(cur))
    return [item for item in items if item]  # 'a,,b' is a b, as in scontrol


def _expand_group(expr: str, group: str) -> list[str]:
    """'1-3,010-011' -> ['1', '2', '3', '010', '011']."""
    out: list[str] = []
    for part in group.split(","):
        m = _RANGE.match(part)
        if not m:
            raise _fail(expr, f"range {part!r} is not N or N-M", "use digits only, e.g. [1-4,7]")
        lo_text, hi_text = m.group(1), m.group(2) or m.group(1)
        lo, hi = int(lo_text), int(hi_text)
        if hi < lo:
            raise _fail(expr, f"range {part!r} runs backwards", f"write [{hi_text}-{lo_text}]")
        if hi - lo + len(out) >= MAX_HOSTS:
            raise _fail(expr, f"more than {MAX_HOSTS} hosts", "check the range bounds")
        width = len(lo_text)  # padding follows the low bound, as SLURM does
        out.extend(str(n).zfill(width) for n in range(lo, hi + 1))
    return out


def _expand_item(expr: str, item: str) -> list[str]:
    if "[" not in item:
        return [item]
    pieces = _PIECE.findall(item)
    consumed = sum(len(text) + len(group) + 2 for text, group in pieces)
    if consumed != len(item):
        # scontrol rejects text after the last bracket group ('n[1-2]-ib') as well
        raise _fail(expr, f"text after the last ']' in {item!r}",
                    "put every suffix before a bracket group, e.g. n[1-2]-ib[0]")
    choices = [[text + n for n in _expand_group(expr, group)] for text, group in pieces]
    # Each group is bounded on its own; their product must be too, before it is built.
    if math.prod(len(c) for c in choices) > MAX_HOSTS:
        raise _fail(expr, f"more than {MAX_HOSTS} hosts", "check the range bounds")
    # Row-major product: the last group varies fastest (matches scontrol for 1 and 2 groups).
    return ["".join(combo) for combo in itertools.product(*choices)]


def expand(expr: str) -> list[str]:
    """Expand a SLURM hostlist expression into the list of host names, in SLURM's order."""
    if not isinstance(expr, str):
        raise TypeError(f"hostlist must be a str, got {type(expr).__name__}")
    hosts: list[str] = []
    for item in _split_items(expr.strip()):
        hosts.extend(_expand_item(expr, item))
        if len(hosts) > MAX_HOSTS:
            raise _fail(expr, f"more than {MAX_HOSTS} hosts", "check the range bounds")
    return hosts
