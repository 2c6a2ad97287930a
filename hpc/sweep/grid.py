"""Sweep grids: `--sweep key=a,b other=x,y` (or a YAML grid file) -> points, each named by a signature.

    python -m hpc.submit tiny --sweep tiny.score=1,2 tiny.sleep_s=0,1 --dry-run

Pure and torch-free. A grid is an ordered mapping of dotted config keys to their values; its points
are the cartesian product, in grid order. A point's signature is a short hash of its resolved
overrides (each value read as YAML, so `lr=0.10` and `lr=0.1` are one point, and `--sweep b=1 a=2`
is the point of `--sweep a=2 b=1`): the same point always gets the same run directory.
"""
from __future__ import annotations

import hashlib
import itertools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence

import yaml

from hpc.config.layers import close_keys
from hpc.config.schema import ConfigError
from hpc.rundir.sweepdir import describe

SIGNATURE_CHARS = 10  # hex digits of sha256 kept: 40 bits, no collision in any grid a person submits
# Keys a point may not vary: one array job per stage shares its resources, and the sweep itself
# places each point's run directory and picks the cluster.
FIXED_PREFIXES = ("stages.", "cluster.", "run.")
HINT_SYNTAX = "HINT: write --sweep KEY=V1,V2 [KEY2=W1,W2 ...], e.g. --sweep tiny.score=1,2 (lists as key=[1,2],[3])"


class SweepError(ConfigError):
    """A grid that cannot be read: the message says what was seen, what is expected, and a HINT."""


@dataclass(frozen=True)
class Point:
    overrides: Dict[str, Any]  # swept key -> resolved value, in grid order
    signature: str

    def args(self) -> List[str]:
        """The point as command-line overrides (values as JSON, which YAML reads back unchanged)."""
        return [f"{k}={json.dumps(v, default=str)}" for k, v in self.overrides.items()]

    def describe(self) -> str:
        return describe(self.overrides)


def signature(overrides: Mapping[str, Any]) -> str:
    """A stable short hash of resolved overrides: independent of key order, the same in every process."""
    text = json.dumps(sorted(overrides.items()), sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:SIGNATURE_CHARS]


def resolve(text: str) -> Any:
    """A value as the config reads it: YAML (1 -> int, 0.10 -> 0.1, [1,2] -> list); else the text."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def split_values(text: str) -> List[str]:
    """'a,[1,2],"x,y"' -> ['a', '[1,2]', '"x,y"']: commas inside brackets or quotes do not split."""
    out, depth, quote, start = [], 0, "", 0
    for i, c in enumerate(text):
        if quote:
            quote = "" if c == quote else quote
        elif c in "'\"":
            quote = c
        elif c in "[{":
            depth += 1
        elif c in "]}":
            depth -= 1
        elif c == "," and depth == 0:
            out.append(text[start:i])
            start = i + 1
    return out + [text[start:]]


def parse_tokens(tokens: Sequence[str]) -> Dict[str, List[Any]]:
    """`--sweep` tokens -> grid. Refused: no tokens, a token without '=', an empty key or value,
    a key given twice."""
    if not tokens:
        raise SweepError(f"--sweep was given no axes; expected at least one KEY=V1,V2. {HINT_SYNTAX}")
    grid: Dict[str, List[Any]] = {}
    for token in tokens:
        key, sep, values = token.partition("=")
        key = key.strip()
        if not sep or not key:
            what = "has no '='" if not sep else "has no key before '='"
            raise SweepError(f"--sweep {token!r} {what}; expected KEY=V1,V2. {HINT_SYNTAX}")
        parts = split_values(values)
        if any(not p.strip() for p in parts):
            raise SweepError(f"--sweep {token!r} has an empty value; expected KEY=V1,V2 with no empty "
                             f"value between commas. {HINT_SYNTAX}")
        _add(grid, key, [resolve(p.strip()) for p in parts], f"--sweep {token!r}")
    return grid


def read_file(path: Path) -> Dict[str, List[Any]]:
    """A YAML grid file: a mapping of dotted keys to a list of values (or one value)."""
    hint = "HINT: write one line per key, e.g. `tiny.score: [1, 2]`."
    try:
        data = yaml.safe_load(Path(path).read_text())
    except OSError as err:
        raise SweepError(f"--sweep-file {path}: cannot be read ({err.strerror}); expected a YAML grid file. "
                         "HINT: pass the path of an existing file.") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        raise SweepError(f"--sweep-file {path}{line}: YAML syntax error; expected a mapping of keys to value "
                         f"lists. {hint}") from None
    if not isinstance(data, dict) or not data:
        raise SweepError(f"--sweep-file {path} holds {type(data).__name__ if data else 'nothing'}; expected a "
                         f"mapping of config keys to value lists. {hint}")
    grid: Dict[str, List[Any]] = {}
    for key, values in data.items():
        values = values if isinstance(values, list) else [values]
        if not str(key).strip() or not values:
            raise SweepError(f"--sweep-file {path}: key {key!r} has {'no values' if key else 'no name'}; "
                             f"expected a dotted key with at least one value. {hint}")
        _add(grid, str(key).strip(), values, f"--sweep-file {path}")
    return grid


def _add(grid: Dict[str, List[Any]], key: str, values: List[Any], origin: str) -> None:
    if key in grid:
        raise SweepError(f"{origin}: key {key!r} is given twice; expected each key once. "
                         f"HINT: list all its values in one place: {key}=V1,V2,V3.")
    duplicates = [v for i, v in enumerate(values) if v in values[:i]]
    if duplicates:
        raise SweepError(f"{origin}: value(s) {duplicates} of {key!r} repeat; expected distinct values. "
                         "HINT: list each value once.")
    grid[key] = values


def merge(*grids: Mapping[str, List[Any]]) -> Dict[str, List[Any]]:
    """Grids from the command line and a file, one axis each: a key in both is refused."""
    out: Dict[str, List[Any]] = {}
    for g in grids:
        for key, values in g.items():
            _add(out, key, list(values), "--sweep and --sweep-file")
    return out


def check_keys(grid: Mapping[str, Any], known: Iterable[str], pipeline: str,
               accepts: Optional[Callable[[str], bool]] = None) -> None:
    """Every key must be a config key that a point may vary: not a stage's resources, the cluster or
    the run's place. `known`: the dotted leaf keys of the config; `accepts`: whether a key=value
    override would be taken (hpc.config.layers.accepts), so that a key a plain override may set, a new
    key of a Dict field included, is an axis too."""
    known = set(known)
    for key in grid:
        if key.startswith(FIXED_PREFIXES):
            raise SweepError(f"--sweep {key}: {key.split('.')[0]}.* is shared by all points of a sweep "
                             "(each stage runs as one array job); expected a key of the pipeline's own "
                             f"settings. HINT: pass {key}=VALUE before --sweep, for every point.")
        if key not in known and not any(k.startswith(key + ".") for k in known) and not (accepts and accepts(key)):
            raise SweepError(f"--sweep {key}: unknown config key of pipeline {pipeline}; expected one of "
                             f"{_near(key, known)}. HINT: check the spelling against the pipeline's config.")


def _near(key: str, known: Iterable[str]) -> List[str]:
    """The known keys a misspelt one most likely meant, at the first level where it leaves them."""
    parts, known = key.split("."), sorted(known)
    for depth in range(len(parts)):
        prefix = ".".join(parts[:depth])
        under = [k for k in known if not prefix or k.startswith(prefix + ".")]
        names = sorted({k[len(prefix) + 1 if prefix else 0:].split(".")[0] for k in under})
        if parts[depth] not in names:
            near = [f"{prefix}.{n}" if prefix else n for n in close_keys(parts[depth], names)]
            return near or under[:12] or known[:12]
    return known[:12]


def leaf_keys(tree: Mapping[str, Any], prefix: str = "") -> List[str]:
    """Dotted keys of a nested mapping's leaves (lists and empty mappings are leaves)."""
    out = []
    for key, value in tree.items():
        dotted = f"{prefix}{key}"
        out += leaf_keys(value, dotted + ".") if isinstance(value, Mapping) and value else [dotted]
    return out


def points(grid: Mapping[str, Sequence[Any]]) -> List[Point]:
    """The cartesian product of the grid, in grid order, each with its signature."""
    keys = list(grid)
    out = []
    for combo in itertools.product(*(grid[k] for k in keys)):
        overrides = dict(zip(keys, combo))
        out.append(Point(overrides, signature(overrides)))
    return out
