"""Named clusters: the user's file saying how to reach each login node, and what hpc runs in there.

    python -c "from hpc.remote import clusters; print(clusters.load())"

The file is ~/.config/hpc/clusters.yaml ($XDG_CONFIG_HOME/hpc/ where set; HPC_CLUSTERS_FILE names
another), one entry per cluster (docs/remote.md):

    jean-zay:
      ssh: alice@jean-zay.idris.fr    # or `local`: this machine, no ssh
      port: 22                        # identity: ~/.ssh/id_ed25519, jump: bastion.example.org
      python: /home/alice/venv/bin/python   # the interpreter that has hpc there (python3)
      setup: module load pytorch      # a shell line run before it
      runs: /scratch/alice/hpc-runs   # the root of run directories there
      profile: gpu8                   # partition, account, qos: defaults of every stage
      notify: {mail: alice@example.org}   # over the file's top-level notify: for runs there

A top-level `notify:` names no cluster: it is the user's notify for every run (hpc.config.userfile).
parse() is pure: text in, {name: Cluster} out, or one ConfigError naming the file, the entry and the
key. find() refuses an unknown name with the closest names.
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Tuple

from hpc.config import userfile
from hpc.config.checks import CLUSTER_KINDS, ConfigError
from hpc.config.userfile import ENV, KEY, path  # noqa: F401  (the file's place, and its notify: key)

LOCAL = "local"  # ssh: local runs the commands on this machine
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
TARGET = re.compile(r"([A-Za-z0-9_.][A-Za-z0-9_.-]*@)?[A-Za-z0-9_.:\[\]-]+")  # user@host, host, [v6]
OPTION = re.compile(r"[A-Za-z][A-Za-z0-9]*")  # an ssh -o option name
# key -> (type, what it holds), for the checks and their messages
KEYS: Dict[str, Tuple[type, str]] = {
    "ssh": (str, "user@host, or local"), "port": (int, "a TCP port"), "identity": (str, "a key file"),
    "jump": (str, "a jump host, user@host[:port]"), "options": (dict, "ssh -o options, Name: value"),
    "python": (str, "the interpreter that has hpc there"), "setup": (str, "a shell line run first"),
    "runs": (str, "the root of run directories there"), "profile": (str, "a profile name"),
    "partition": (str, "a partition"), "account": (str, "an account"), "qos": (str, "a QOS"),
    KEY: (dict, "a run's notify keys (webhook, command, mail, ...)"),
}
DEFAULTS = ("partition", "account", "qos")  # profile values every stage gets, below the user's overrides


@dataclass(frozen=True)
class Cluster:
    """One entry of the file."""

    name: str
    ssh: Optional[str]  # user@host; None: this machine (ssh: local)
    port: Optional[int] = None
    identity: Optional[str] = None
    jump: Optional[str] = None
    options: Tuple[Tuple[str, str], ...] = ()  # further ssh -o Name=value, in the file's order
    python: str = "python3"
    setup: str = ""
    runs: str = "hpc-runs"  # relative: to the login's home directory
    profile: Optional[str] = None
    partition: Optional[str] = None
    account: Optional[str] = None
    qos: Optional[str] = None
    notify: Optional[Dict[str, Any]] = field(default=None, compare=False)  # over the file's top-level notify:

    def defaults(self) -> Dict[str, str]:
        return {k: getattr(self, k) for k in DEFAULTS if getattr(self, k)}


def load(environ: Mapping[str, str] = os.environ) -> Dict[str, Cluster]:
    """The named clusters; {} when the file does not exist."""
    where = path(environ)
    try:
        text = where.read_text()
    except FileNotFoundError:
        return {}
    except OSError as err:
        raise ConfigError(f"{where}: cannot be read ({err.strerror}); expected the named clusters. "
                          f"HINT: fix its permissions, or point {ENV} at another file.") from None
    return parse(text, str(where))


def parse(text: str, source: str = "clusters.yaml") -> Dict[str, Cluster]:
    """{name: Cluster} of the file's text; ConfigError for anything else, naming where."""
    import yaml  # here: only a submission to a named cluster reads the file

    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        at = f" line {mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"{source}{at}: not YAML ({getattr(err, 'problem', None) or 'syntax'}); expected a "
                          "mapping of cluster names to entries. HINT: see docs/remote.md for an example.") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: a {type(data).__name__} at the top; expected a mapping of cluster names "
                          "to entries. HINT: see docs/remote.md for an example.")
    return {str(name): entry(str(name), body, source) for name, body in data.items() if name != KEY}


def entry(name: str, body: Any, source: str) -> Cluster:
    where = f"{source}: cluster {name!r}"
    if not NAME.fullmatch(name) or name in CLUSTER_KINDS:
        raise ConfigError(f"{where}: not a cluster name; expected letters, digits, '.', '_', '-', and none of "
                          f"{list(CLUSTER_KINDS)} (hpc's own kinds). HINT: rename the entry.")
    if not isinstance(body, dict):
        raise ConfigError(f"{where} is a {type(body).__name__}; expected a mapping with at least ssh: user@host. "
                          "HINT: see docs/remote.md for an example.")
    unknown = sorted(map(str, set(body) - set(KEYS)))
    if unknown:
        import difflib  # only for a refusal: a submission never loads it

        close = difflib.get_close_matches(unknown[0], KEYS, n=1)
        raise ConfigError(f"{where}: unknown key {unknown[0]!r}; expected one of {sorted(KEYS)}. "
                          f"HINT: {f'did you mean {close[0]}?' if close else 'remove it.'}")
    for key, value in body.items():
        kind, what = KEYS[key]
        if not isinstance(value, kind) or isinstance(value, bool) or value in ("", None):
            raise ConfigError(f"{where}: {key}={value!r}; expected {what}. HINT: fix or remove {key}.")
    if "ssh" not in body:
        raise ConfigError(f"{where} has no ssh key; expected ssh: user@host (or ssh: local). HINT: add it.")
    ssh = body["ssh"]
    if ssh != LOCAL and not TARGET.fullmatch(ssh):
        raise ConfigError(f"{where}: ssh={ssh!r}; expected user@host, host or local. HINT: fix ssh.")
    port = body.get("port")
    if port is not None and not 0 < port < 65536:
        raise ConfigError(f"{where}: port={port}; expected 1 to 65535. HINT: fix port (ssh's default is 22).")
    options = tuple((str(k), str(v)) for k, v in (body.get("options") or {}).items())
    bad = [k for k, v in options if not OPTION.fullmatch(k) or "\n" in v]
    if bad:
        raise ConfigError(f"{where}: ssh option {bad[0]!r}; expected a name such as ServerAliveInterval and a "
                          "one-line value. HINT: fix options.")
    fields = {k: v for k, v in body.items() if k not in ("ssh", "options")}
    return Cluster(name=name, ssh=None if ssh == LOCAL else ssh, options=options, **fields)


def notify_overrides(cluster: Cluster, environ: Mapping[str, str] = os.environ) -> List[str]:
    """A run on `cluster`'s notify from this machine's file (its top-level notify:, the cluster's own
    over it) as key=value overrides for the submission there, which puts them before the user's own."""
    mine = {**userfile.section(userfile.read(environ), environ), **(cluster.notify or {})}
    return [f"{KEY}.{k}={json.dumps(v)}" for k, v in mine.items()]


def is_named(kind: Optional[str]) -> bool:
    """Whether a --cluster value names a cluster of the file rather than one of hpc's kinds."""
    return bool(kind) and kind not in CLUSTER_KINDS


def find(name: str, known: Optional[Mapping[str, Cluster]] = None) -> Cluster:
    """The named cluster; ConfigError with the closest names when there is none."""
    known = load() if known is None else known
    if name in known:
        return known[name]
    choices = [*known, *CLUSTER_KINDS]
    import difflib  # only for a refusal

    close = difflib.get_close_matches(name, choices, n=3, cutoff=0.5)
    hint = f"did you mean {' or '.join(close)}?" if close else f"add an entry {name}: to {path()} (docs/remote.md)."
    raise ConfigError(f"unknown cluster {name!r}; expected one of {choices} (named in {path()}, or hpc's kinds). "
                      f"HINT: {hint}")
