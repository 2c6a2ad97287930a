"""Checks of a built config: what hpc refuses before anything reaches the scheduler.

    check_resources(cfg)   # impossible or unsafe resource requests (hpc.config.schema.load calls both)
    check_text(data)       # control characters in any key or value (data: hpc.config.schema.to_dict(cfg))

Each refusal is a ConfigError whose one line says what was seen, what is valid, and a HINT.
hpc.config.schema re-exports these names; hpc.config.cache keys its entries on this file too, since a
changed check may refuse a config it kept.
"""
from __future__ import annotations

import re
from typing import Any, Dict, Iterator, Optional, Tuple

from hpc.slurm import noderange


class ConfigError(ValueError):
    """Bad user configuration: the message says what was seen, what is valid, and a HINT."""


CLUSTER_KINDS = ("auto", "slurm", "local", "debug", "here")  # here: srun steps of this salloc (hpc.here)
# Values that end up as sbatch options: one shell-safe token (submitit quotes them too; a newline
# inside a #SBATCH value would still start a new script line, so refuse it outright). fullmatch, not
# match with `$`: `$` also matches before a trailing newline.
_SAFE_VALUE = re.compile(r"[A-Za-z0-9_.:,@%+=/\-\[\]]+")
_OPTION_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]*")  # a long sbatch option, as a stages.*.extra key
# Resource bounds, (lowest, highest): a request beyond them is a typo, not a job. 64 GPUs per node is
# above any node built today (8 to 16); local_tasks is a fixed 64 rather than this machine's core count
# so that a config means the same on every machine (each local task is a whole process).
LIMITS: Dict[str, Tuple[int, Optional[int]]] = {
    "nodes": (1, 10_000), "gpus_per_node": (0, 64), "tasks_per_node": (1, 1024), "cpus_per_task": (1, 1024),
    "time_min": (1, 366 * 24 * 60), "signal_delay_s": (0, None), "max_timeouts": (0, 1000), "local_tasks": (1, 64),
    "max_node_failures": (0, 1000), "max_restarts_in_place": (0, 1000), "spare_nodes": (0, 10_000),
}


def check_resources(cfg: Any) -> None:
    """Refuse impossible resource requests before anything reaches the scheduler."""
    if cfg.cluster.kind not in CLUSTER_KINDS:
        raise ConfigError(f"cluster.kind={cfg.cluster.kind!r}; expected one of {list(CLUSTER_KINDS)}. "
                          "HINT: --cluster auto picks slurm when sbatch answers, else local.")
    if cfg.run.snapshot_max_mb <= 0:
        raise ConfigError(f"run.snapshot_max_mb={cfg.run.snapshot_max_mb}; expected a size in MB above 0. "
                          "HINT: raise it, or pass --no-snapshot (run.snapshot=false) to copy nothing.")
    directives = [line for line in cfg.cluster.setup if str(line).lstrip().startswith("#SBATCH")]
    if directives:  # sbatch reads #SBATCH lines up to the first command, so these would be options
        raise ConfigError(f"cluster.setup has #SBATCH line(s) {directives}; expected shell commands. "
                          "HINT: put sbatch options in stages.<stage>.extra (e.g. extra.mail-type=END).")
    for name, res in cfg.stages.items():
        try:
            noderange.parse(res.nodes, f"stages.{name}.nodes", LIMITS["nodes"])  # type: ignore[arg-type]
        except noderange.NodeRangeError as err:
            raise ConfigError(str(err)) from None
        for key, (low, high) in LIMITS.items():
            if key == "nodes":
                continue
            if res[key] < low:
                why = " (a GPU count cannot be negative)" if key == "gpus_per_node" else ""
                raise ConfigError(f"stages.{name}.{key}={res[key]}; expected an integer >= {low}{why}. "
                                  f"HINT: set stages.{name}.{key}={low} or more.")
            if high is not None and res[key] > high:
                raise ConfigError(f"stages.{name}.{key}={res[key]} is above hpc's limit of {high}; expected "
                                  f"{low} to {high}. HINT: set stages.{name}.{key} to a real request.")
        if res.array_parallelism is not None and res.array_parallelism < 1:
            raise ConfigError(f"stages.{name}.array_parallelism={res.array_parallelism}; expected an integer >= 1 "
                              f"(array tasks that run at once). HINT: set stages.{name}.array_parallelism=8, "
                              "or null for no throttle.")
        # the pre-timeout signal comes signal_delay_s before the limit: at or past the start, it
        # would come at once and the job would checkpoint and requeue before doing any work
        if res.signal_delay_s >= res.time_min * 60:
            raise ConfigError(f"stages.{name}.signal_delay_s={res.signal_delay_s} is not below the time limit "
                              f"stages.{name}.time_min={res.time_min} ({res.time_min * 60} s); expected "
                              "signal_delay_s < 60 * time_min. HINT: lower signal_delay_s or raise time_min.")
        check = res.get("node_check") or {}
        for key, low in (("timeout_s", 1), ("collective_mb", 0.001), ("avoid_after", 1)):
            if key in check and check[key] < low:  # hpc.recovery.nodecheck: a bound, a size, a count
                raise ConfigError(f"stages.{name}.node_check.{key}={check[key]}; expected a number >= {low}. "
                                  f"HINT: set stages.{name}.node_check.{key}={low} or more, or leave it out.")
        bad_keys = [k for k in res.extra if not _OPTION_NAME.fullmatch(str(k))]
        if bad_keys:
            raise ConfigError(f"stages.{name}.extra has key(s) {bad_keys} that are not sbatch option names; "
                              "expected letters, digits, '-' and '_' (e.g. mail-type). HINT: use the long "
                              "option name without the leading --.")
        values = {k: res[k] for k in ("mem", "partition", "account", "qos", "constraint")}
        values.update({f"extra.{k}": v for k, v in res.extra.items()})
        for key, value in values.items():
            if value is not None and not _SAFE_VALUE.fullmatch(str(value)):
                raise ConfigError(f"stages.{name}.{key}={value!r} is empty or has characters sbatch options "
                                  "may not contain (spaces, quotes, newlines, ;|&$`). HINT: use a plain token.")


def check_text(data: Any) -> None:
    """Refuse control characters in every key and value: setup lines, paths, commands and partition
    names reach sbatch scripts, and a newline there would start a line of its own (quoting does not
    help: submitit writes setup lines verbatim, and sbatch reads #SBATCH lines one line at a time)."""
    for path, text in _texts(data):
        if has_control(text):
            raise ConfigError(f"{path!r}: {text!r} contains a control character (newline, tab, ...); "
                              "expected printable text. HINT: write it on one line, without escapes.")


def _texts(node: Any, path: str = "") -> Iterator[Tuple[str, str]]:
    """(dotted path, text) for every string key and value, inside lists too."""
    if isinstance(node, dict):
        for key, value in node.items():
            sub = f"{path}.{key}" if path else str(key)
            yield sub, str(key)
            yield from _texts(value, sub)
    elif isinstance(node, (list, tuple)):
        for i, value in enumerate(node):
            yield from _texts(value, f"{path}[{i}]")
    elif isinstance(node, str):
        yield path, node


# Unicode's categories Cc (C0 and C1 controls, DEL: a set its stability policy never changes), Zl and
# Zp (U+2028, U+2029) as a character class: importing unicodedata costs a submission more than every
# check here (tests/test_config_checks.py compares the two over every code point).
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def has_control(text: str) -> bool:
    """Control characters (\\n, \\r, \\t, \\x00, ...) and the Unicode line and paragraph separators."""
    return _CONTROL.search(text) is not None
