"""A user's script's exit: the process group it left initialised is destroyed while its interpreter is
still whole, and a clean exit is recorded, so that a crash in the teardown after the work never costs
a rerun.

    install(os.environ)                     # in the script's interpreter (site/sitecustomize.py)
    status(proc.returncode, folder, proc.pid, rank)   # in the wrapper (hpc.scripts.runner), once it has exited

A script that ends without torch.distributed.destroy_process_group() (the HF Trainer's scripts never
call it) leaves its group to C++'s destructors at process exit, where gloo's threads now and then abort
the finished process ("terminate called without an active exception", SIGABRT; NCCL's watchdog may do
the same): a rank that trained to the end counted as failed, and its step ran again from the last
checkpoint. So at a normal exit (no exception escaped, sys.exit with no error, in the process that
installed this, not a forked child) the default group is destroyed here, in a thread waited on for
DESTROY_WAIT_S at most: NCCL's shutdown may wait on a dead peer, and the exit must never hang on it.
Then the process writes its record, `<pid>.json` in the folder ENV names. A process that then dies of
SIGABRT, SIGSEGV or SIGBUS had finished its work: the wrapper counts it as exit status 0, and says so.
Not told apart: a script's own `raise SystemExit(1)` (sys.exit's status is seen, a raised SystemExit's
is not) followed by such a crash.
"""
from __future__ import annotations

import atexit
import json
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any, Dict, Mapping

from hpc.fs import atomic

ENV = "HPC_EXIT_RECORD"  # the folder a script's interpreter writes <pid>.json into at a clean exit
DESTROY_WAIT_S = 10.0  # how long a normal exit waits for the process group's destruction
TEARDOWN_SIGNALS = (signal.SIGABRT, signal.SIGSEGV, signal.SIGBUS)  # how a teardown crash ends a process


def install(environ: Mapping[str, str]) -> None:
    """At this interpreter's normal exit: destroy the default process group, then write the record."""
    seen: Dict[str, Any] = {"pid": os.getpid(), "status": None}
    original = sys.exit

    def exit(status: Any = None) -> None:  # noqa: A001 - sys.exit, with its status kept for at_exit
        seen["status"] = status
        original(status)

    sys.exit = exit
    atexit.register(at_exit, environ.get(ENV, ""), seen)


def at_exit(folder: str, seen: Mapping[str, Any]) -> None:
    """Registered first, so it runs after every atexit function of the script and its libraries."""
    if os.getpid() != seen["pid"] or getattr(sys, "last_value", None) is not None or \
            seen["status"] not in (None, 0):
        return  # a forked child, or a failure: its status stands, and a peer may be dead
    group = destroy_group()
    if folder:
        try:  # read by the wrapper on this node once the process has ended: whole, not durable
            atomic.write_text(Path(folder) / f"{os.getpid()}.json", json.dumps({"pid": os.getpid(), "group": group}),
                              durable=False)
        except OSError:
            pass  # no record: a crash at exit then counts as a failure, as without hpc


def destroy_group(wait_s: float = DESTROY_WAIT_S) -> str:
    """Destroy torch.distributed's default group, if the script left one: 'destroyed', 'none' (none
    was left), or 'not destroyed' (its shutdown took longer than wait_s, or failed)."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return "none"
    result = ["not destroyed"]

    def destroy() -> None:
        try:
            dist.destroy_process_group()
            result[0] = "destroyed"
        except Exception:  # noqa: BLE001 - the exit goes on whatever the group says
            pass
    thread = threading.Thread(target=destroy, name="hpc-destroy-group", daemon=True)
    try:
        thread.start()
    except RuntimeError:  # no new thread while the interpreter shuts down (newer Pythons): left as it is
        return result[0]
    thread.join(wait_s)
    return result[0]


def status(code: int, folder: str, pid: int, rank: int) -> int:
    """The script's exit status as the wrapper counts it: 0 where it died of a teardown signal after
    its record was written (its work was done), else `code`."""
    signum = -code if code < 0 else code - 128 if code > 128 else 0
    if signum not in TEARDOWN_SIGNALS or not folder or not (Path(folder) / f"{pid}.json").is_file():
        return code
    print(f"[hpc] rank {rank}: the script ended normally, then died of {signal.Signals(signum).name} in its "
          "interpreter's teardown (a process group's threads at exit): counted as a normal exit, not run again",
          file=sys.stderr, flush=True)
    return 0
