"""Expand SLURM hostlist expressions exactly as `scontrol show hostnames` does (Slurm 22.05).

    python -c "from hpc.slurm.hostlist import expand; print(expand('gpu-a[001-003,010],gpu-b07'))"

The rules below were found by experiment against scontrol and by reading Slurm's hostlist.c;
tests/test_hostlist.py fuzzes them against scontrol wherever it is installed.

- Tokens are separated by ',', ' ' or tab, except inside a bracket pair that spans a separator.
  Every other character (newline included) is part of a name.
- A token's LAST '[' opens its range list, closed by the first ']' after it; that ']' must end the
  token. A token with a '[' and no ']' after it is kept as a name: `n[1-` is the host `n]`.
- A range is `LO` or `LO-HI`, parsed like C's strtoul: leading whitespace and a '+' are skipped,
  ASCII digits only. Zero padding is the byte length of LO's text (`[ 1-2]` gives 01 and 02,
  `[007-10]` 007..010). `LO-` is LO. Text after LO's digits is ignored only when a HI follows.
  No 'x', no negative numbers, LO <= HI, at most 65536 hosts per range.
- Earlier bracket groups of a token are prefixes, expanded from the second-to-last group outwards:
  for `a[1-2]b[3-4]c[5-6]`, c varies fastest, then a, then b. A group's hosts are limited to 65536.
- Duplicates and the order of the expression are kept. A host that continues the previous range
  (same prefix up to whitespace, next number, compatible padding) joins it and takes its prefix.

Refused (HostlistError), where scontrol prints an error: bad ranges anywhere, text after the ']'.
Refused as well, where scontrol prints garbage or crashes: numbers of 2^64-1 and above, ranges
in the earlier groups that scontrol skips silently, and more than MAX_HOSTS hosts in all.
Pure: no SLURM, no torch.
"""

from __future__ import annotations

__all__ = ["expand", "HostlistError"]

SEPARATORS = "\t, "
C_SPACE = " \t\n\v\f\r"  # isspace() in the C locale: what strtoul and strnatcmp skip
ULONG_MAX = 2**64 - 1
MAX_RANGE = 64 * 1024  # hosts in one range, and in one prefix group (Slurm's limits)
# Largest expansion we agree to build: a typo like n[1-9999]x[1-9999] must not eat the memory.
MAX_HOSTS = 1_000_000


class HostlistError(ValueError):
    """A hostlist expression that SLURM refuses (or would mangle)."""


def _fail(expr: str, what: str, hint: str) -> HostlistError:
    return HostlistError(
        f"invalid hostlist {expr!r}: {what}. Expected SLURM syntax such as "
        f"'gpu-a[001-003,010],gpu-b07'. HINT: {hint}"
    )


def _tokens(expr: str) -> list[str]:
    """Split at separators, keeping a bracket pair that spans a separator inside one token."""
    out, pos, n = [], 0, len(expr)
    while True:
        while pos < n and expr[pos] in SEPARATORS:
            pos += 1
        if pos == n:
            return out
        start = scan = end = pos
        while True:
            while end < n and expr[end] not in SEPARATORS:
                end += 1
            opened = expr.find("[", scan)
            closed = expr.find("]", scan)
            if opened < 0 or opened > end or closed < opened:
                break
            if closed < end:
                scan = closed + 1  # a complete pair before the separator: look further on
                continue
            end = closed  # the pair spans the separator: the token runs past it
        out.append(expr[start:end])
        pos = end


def _strtoul(text: str) -> tuple[int, int]:
    """(value, characters consumed) as C's strtoul(text, &end, 10); consumed 0: no number."""
    i = 0
    while i < len(text) and text[i] in C_SPACE:
        i += 1
    negative = i < len(text) and text[i] == "-"
    if i < len(text) and text[i] in "+-":
        i += 1
    digits = i
    while i < len(text) and "0" <= text[i] <= "9":
        i += 1
    if i == digits:
        return 0, 0
    value = int(text[digits:i])
    if value > ULONG_MAX:
        return ULONG_MAX, i
    return (-value % 2**64 if negative else value), i


def _range(expr: str, part: str) -> tuple[int, int, int]:
    """One `LO[-HI]` of a bracket group: (lo, hi, width)."""
    def bad(why: str = "is not N or N-M") -> HostlistError:
        return _fail(expr, f"range {part!r} {why}", "use ASCII digits only, e.g. [1-4,7]")

    lo_text, dash, hi_text = part.partition("-")
    if "x" in part or hi_text.startswith("-"):
        raise bad()
    lo, used = _strtoul(lo_text)
    if not used:
        raise bad()
    if hi_text:
        hi, hi_used = _strtoul(hi_text)
        if hi_used != len(hi_text):
            raise bad()
    elif used != len(lo_text):
        raise bad()
    else:
        hi = lo
    if lo > hi:
        raise bad(f"runs backwards (write [{hi_text}-{lo_text}])")
    if hi - lo + 1 > MAX_RANGE:
        raise bad(f"has more than {MAX_RANGE} hosts, SLURM's limit")
    if hi >= ULONG_MAX:
        raise bad(f"reaches {ULONG_MAX}, which SLURM cannot count past")
    try:
        width = len(lo_text.encode("utf-8", "surrogateescape"))  # strlen(): bytes
    except UnicodeEncodeError:
        raise bad("is not valid text") from None
    return lo, hi, width


def _group(expr: str, text: str) -> list[tuple[int, int, int]]:
    parts = text.split(",")
    if len(parts) > MAX_RANGE:
        raise _fail(expr, f"more than {MAX_RANGE} ranges in one bracket group, SLURM's limit",
                    "merge neighbouring ranges")
    return [_range(expr, part) for part in parts]


class _Hosts:
    """The ranges in push order; a pushed range may join the previous one, as in Slurm."""

    def __init__(self, expr: str):
        self.expr = expr
        self.ranges: list[list] = []  # [prefix, lo, hi, width]; width None: a name without number
        self.count = 0

    def push(self, prefix: str, lo: int, hi: int, width: int | None) -> None:
        self.count += hi - lo + 1
        if self.count > MAX_HOSTS:
            raise _fail(self.expr, f"more than {MAX_HOSTS} hosts", "check the range bounds")
        if self.ranges and width is not None and self._joins(self.ranges[-1], prefix, lo, width):
            self.ranges[-1][2] = hi
        else:
            self.ranges.append([prefix, lo, hi, width])

    @staticmethod
    def _joins(tail: list, prefix: str, lo: int, width: int) -> bool:
        t_prefix, t_lo, t_hi, t_width = tail
        if t_width is None or t_hi != lo - 1 or _squeeze(t_prefix) != _squeeze(prefix):
            return False
        if t_width == width:
            return True
        t_changes = _pad(t_lo, t_width) != _pad(t_lo, width)
        if t_changes and _pad(lo, width) != _pad(lo, t_width):
            return False  # each padding would change the other's numbers
        if not t_changes:
            tail[3] = width
        return True

    def push_name(self, name: str) -> None:
        digits = len(name) - len(name.rstrip("0123456789"))
        if not digits:
            self.push(name, 0, 0, None)
            return
        number = int(name[-digits:])
        if number >= ULONG_MAX:
            raise _fail(self.expr, f"the number of {name!r} reaches {ULONG_MAX}",
                        "SLURM cannot count past it: rename the host")
        self.push(name[:-digits], number, number, digits)

    def names(self) -> list[str]:
        out: list[str] = []
        for prefix, lo, hi, width in self.ranges:
            if width is None:
                out.append(prefix)
            else:
                out.extend(prefix + str(n).zfill(width) for n in range(lo, hi + 1))
        return out


def _squeeze(text: str) -> str:
    """What strnatcmp compares: the text without whitespace."""
    return "".join(ch for ch in text if ch not in C_SPACE)


def _pad(number: int, width: int) -> int:
    return max(0, width - len(str(number)))


def _push_groups(hosts: _Hosts, prefix: str, last: list[tuple[int, int, int]]) -> None:
    """Expand the bracket groups left in `prefix`, then push the last group's ranges."""
    opened = prefix.rfind("[")
    closed = prefix.rfind("]", opened + 1) if opened >= 0 else -1
    if closed < 0:
        for lo, hi, width in last:
            hosts.push(prefix, lo, hi, width)
        return
    head, tail = prefix[:opened], prefix[closed + 1:]
    group = _group(hosts.expr, prefix[opened + 1:closed])
    if sum(hi - lo + 1 for lo, hi, _ in group) > MAX_RANGE:
        raise _fail(hosts.expr, f"a bracket group before the last has more than {MAX_RANGE} "
                    "hosts, SLURM's limit", "split the expression")
    for lo, hi, width in group:
        for number in range(lo, hi + 1):
            _push_groups(hosts, head + str(number).zfill(width) + tail, last)


def expand(expr: str) -> list[str]:
    """Expand a SLURM hostlist expression into the list of host names, in SLURM's order."""
    if not isinstance(expr, str):
        raise TypeError(f"hostlist must be a str, got {type(expr).__name__}")
    hosts = _Hosts(expr)
    for token in _tokens(expr):
        opened = token.rfind("[")
        if opened < 0:
            hosts.push_name(token)
            continue
        prefix, rest = token[:opened], token[opened + 1:]
        closed = rest.find("]")
        if closed < 0:  # no ']' after the last '[': scontrol keeps it as a name
            hosts.push_name(prefix + "]" if prefix else rest)
            continue
        if closed + 1 < len(rest) and rest[closed + 1] != ",":
            raise _fail(expr, f"text after the last ']' in {token!r}",
                        "put every suffix before a bracket group, e.g. n[1-2]-ib[0]")
        _push_groups(hosts, prefix, _group(expr, rest[:closed]))
    return hosts.names()
