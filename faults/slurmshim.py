"""SLURM's real clients wrapped to fail on chosen calls: a busy or restarting controller, on demand.

    python -c "from faults.slurmshim import SlurmShim, TIMEOUT; s = SlurmShim('/tmp/shim'); s.rule('squeue', [1], TIMEOUT); print(s.bin)"

SlurmShim(directory) writes one wrapper per client (sbatch, squeue, sacct, scontrol, scancel, sinfo;
never srun) into directory/bin. Put that folder first on PATH (`shim.env(base_env)`) of the
submitting process; sbatch passes PATH on, so the jobs' clients are wrapped too. Each wrapper finds
the real client further along PATH, counts its call (per client, and per client and first argument:
`scontrol requeue`) in a counter file under flock, so concurrent calls count right, appends the call
to calls.log, and applies the first rule that names this call number:

- refuse: print SLURM's words to stderr and exit 1 without running the real client;
- after: run the real client, drop its answer, then print the words and exit 1 (sbatch queued the
  job anyway, and its id is lost);
- empty: print nothing and exit 0 (an empty squeue answer from a loaded controller);
- hang: sleep `sleep_s`, then run the real client (a caller's timeout fires first).

The rules live in a JSON file named by HPC_FAULT_RULES; rewriting it (shim.rule) takes effect at
the next call. `shim.calls()` reads the log for tests that count scheduler calls.
"""
from __future__ import annotations

import json
import os
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterable, List, Mapping, Optional

CLIENTS = ("sbatch", "squeue", "sacct", "scontrol", "scancel", "sinfo")
RULES_ENV = "HPC_FAULT_RULES"

# The words each client prints before the reason, as SLURM's clients do.
_PREFIX = {"sbatch": "sbatch: error: Batch job submission failed: ",
           "squeue": "squeue: error: slurm_load_jobs error: ",
           "scontrol": "scontrol: error: ", "scancel": "scancel: error: ", "sinfo": "sinfo: error: ",
           "sacct": "sacct: error: "}


@dataclass(frozen=True)
class Fault:
    mode: str  # refuse | after | empty | hang
    reason: str = ""  # SLURM's words after the client's prefix ({client} is replaced)
    sleep_s: float = 0.0
    raw: bool = False  # reason is the whole message (no prefix)


TIMEOUT = Fault("refuse", "Socket timed out on send/recv operation")
QUEUED_THEN_TIMEOUT = Fault("after", "Socket timed out on send/recv operation")
BUSY = Fault("refuse", "Resource temporarily unavailable")
UNREACHABLE = Fault("refuse", "{client}: error: Unable to contact slurm controller (connect failure)", raw=True)
EMPTY = Fault("empty")
INVALID_PARTITION = Fault("refuse", "Invalid partition name specified")
SUBMIT_LIMIT = Fault("refuse", "sbatch: error: QOSMaxSubmitJobPerUserLimit\nsbatch: error: Batch job submission "
                     "failed: Job violates accounting/QOS policy (job submit limit, user's size and/or time limits)",
                     raw=True)
DBD_DOWN = Fault("refuse", "sacct: error: slurm_persist_conn_open_without_init: failed to open persistent "
                 "connection to host:localhost:6819: Connection refused\nsacct: error: Sending PersistInit msg: "
                 "Connection refused\nsacct: error: Problem talking to the database: Connection refused", raw=True)


def hang(sleep_s: float) -> Fault:
    return Fault("hang", sleep_s=sleep_s)


def message(client: str, fault: Fault) -> str:
    """What the wrapped client prints to stderr for `fault`."""
    text = fault.reason.replace("{client}", client)
    return text if fault.raw else _PREFIX.get(client, f"{client}: error: ") + text


class SlurmShim:
    """Wrappers in `directory`/bin, rules in `directory`/rules.json, counters and calls.log beside."""

    def __init__(self, directory: os.PathLike, python: str = sys.executable):
        self.root = Path(directory)
        self.bin = self.root / "bin"
        self.rules_path = self.root / "rules.json"
        self.log = self.root / "calls.log"
        self.bin.mkdir(parents=True, exist_ok=True)
        (self.root / "counts").mkdir(exist_ok=True)
        self._rules: List[dict] = []
        self._save()
        self.log.touch()
        for client in CLIENTS:
            path = self.bin / client
            path.write_text(f"#!{python}\n{_WRAPPER}")
            path.chmod(0o755)

    def rule(self, client: str, calls: Iterable[int], fail: Fault, arg: Optional[str] = None) -> "SlurmShim":
        """Calls number `calls` (1-based) of `client` (with first argument `arg`, if given) fail so."""
        self._rules.append({"client": client, "arg": arg, "calls": sorted(calls), **asdict(fail),
                            "message": message(client, fail)})
        self._save()
        return self

    def clear(self) -> None:
        """No more faults; counts and the log are kept."""
        self._rules = []
        self._save()

    def env(self, base: Optional[Mapping[str, str]] = None) -> dict:
        """`base` (default: this process's environment) with the wrappers first on PATH."""
        env = dict(os.environ if base is None else base)
        env["PATH"] = f"{self.bin}{os.pathsep}{env.get('PATH', '')}"
        env[RULES_ENV] = str(self.rules_path)
        return env

    def calls(self, client: Optional[str] = None) -> List[List[str]]:
        """Every call made so far, as argv lists (of `client` only, if given), in order."""
        rows = [json.loads(line) for line in self.log.read_text().splitlines() if line.strip()]
        return [r for r in rows if client is None or r[0] == client]

    def _save(self) -> None:
        tmp = self.rules_path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"counts": str(self.root / "counts"), "log": str(self.log),
                                   "bin": str(self.bin), "rules": self._rules}))
        os.replace(tmp, self.rules_path)


# The wrapper itself: standard library only, as it runs in jobs too.
_WRAPPER = r'''
import fcntl, json, os, subprocess, sys, time

def count(path):
    with open(path, "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        f.seek(0)
        n = int(f.read() or 0) + 1
        f.seek(0)
        f.truncate()
        f.write(str(n))
        return n

def real(name, own):
    for d in os.environ.get("PATH", "").split(os.pathsep):
        p = os.path.join(d, name)
        if d and os.path.realpath(d) != own and os.access(p, os.X_OK) and not os.path.isdir(p):
            return p
    sys.exit(f"{name}: the real client is not on PATH")

name, args = os.path.basename(sys.argv[0]), sys.argv[1:]
own = os.path.realpath(os.path.dirname(os.path.abspath(sys.argv[0])))
conf = json.load(open(os.environ["HPC_FAULT_RULES"]))
with open(conf["log"], "a") as log:
    fcntl.flock(log, fcntl.LOCK_EX)
    log.write(json.dumps([name, *args]) + "\n")
n_all = count(os.path.join(conf["counts"], name))
first = args[0] if args else ""
keys = {None: n_all}
if any(r["arg"] == first and r["client"] == name for r in conf["rules"]):
    keys[first] = count(os.path.join(conf["counts"], f"{name}-{first}"))
rule = next((r for r in conf["rules"] if r["client"] == name and r["arg"] in keys
             and keys[r["arg"]] in r["calls"]), None)
argv = [real(name, own), *args]
if rule is None:
    os.execv(argv[0], argv)
if rule["mode"] == "empty":
    sys.exit(0)
if rule["mode"] == "hang":
    time.sleep(rule["sleep_s"])
    os.execv(argv[0], argv)
if rule["mode"] == "after":
    subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
print(rule["message"], file=sys.stderr)
sys.exit(1)
'''
