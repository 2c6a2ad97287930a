"""srun run to its end under the batch script's SIGTERM, with the ranks' requests polled meanwhile:
the loop of hpc's srun wrapper (hpc.afterstep), which acts on what it sees. The standard library alone:
the wrapper imports it in every batch step of every job.

    code = supervise(["srun", ...], on_end=lambda why: act(why), poll=lambda: serve(request))
"""
from __future__ import annotations

import signal
import subprocess
import time
from typing import Any, Callable, Mapping, Optional, Sequence

WAIT_SLICE_S = 0.5  # supervise's wait for srun, in slices: see there
POLL_S = 1.0  # how often the ranks' folder is listed: hpc.recovery.hostact.POLL_S, a literal here as HOST_ACTS is
AFTER_SRUN_S = 3.0  # how long it is still listed once srun has ended, before no request is taken for none


def supervise(argv: Sequence[str], on_end: Callable[[str], bool], poll: Optional[Callable[[], bool]] = None,
              env: Optional[Mapping[str, str]] = None, stuck: Optional[Callable[[], bool]] = None,
              termed: Optional[Callable[[], bool]] = None) -> int:
    """Run argv (in `env`) to its end; call on_end(why) on each SIGTERM until it returns True (it
    acted), and once more if argv failed, or ended after a SIGTERM (this process's, or one that
    `termed()`, asked then, says its ranks had), and nothing was done yet: SLURM requeues no preempted
    job that ends in its GraceTime. `poll()` is called every POLL_S, and for AFTER_SRUN_S after argv ended, until it returns True (it carried out a rank's request),
    with SIGTERM ignored meanwhile: it runs before on_end, which then finds the job requeued.
    `stuck()`, every POLL_S while argv runs, says when argv will never end by itself (srun waiting
    for the tasks of a node that is gone): argv is killed then. Returns argv's exit status."""
    acted, last, ended, sigterm = [False], [-POLL_S], [""], [False]

    def polled() -> bool:
        held = signal.signal(signal.SIGTERM, signal.SIG_IGN)
        try:
            return bool(poll and poll())
        finally:
            signal.signal(signal.SIGTERM, held)

    def on_term(signum: int, frame: Any) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        sigterm[0] = True
        acted[0] = acted[0] or on_end("SIGTERM")
        signal.signal(signal.SIGTERM, signal.SIG_IGN if acted[0] else on_term)

    before = signal.signal(signal.SIGTERM, on_term)
    try:
        proc = subprocess.Popen(list(argv), env=None if env is None else dict(env))
        while True:
            # Not one blocking wait: a SIGTERM that the kernel hands to another thread of this
            # process (an embedding with threads of its own) only flags it for the main thread,
            # whose waitpid it does not interrupt; the handler would run once srun ended, after
            # SLURM's SIGKILL. Waiting in short slices runs it within a slice (Popen.wait polls).
            # A rank's request is carried out at once, not after srun: a hung rank may never end.
            try:
                code = proc.wait(timeout=WAIT_SLICE_S)
                break
            except subprocess.TimeoutExpired:
                if time.monotonic() - last[0] >= POLL_S:
                    last[0] = time.monotonic()
                    poll = None if polled() else poll
                    if stuck is not None and not ended[0] and stuck():
                        proc.kill()  # its tasks elsewhere have ended: srun waits only for the lost node's
                        ended[0] = "srun ended by hpc: it waited for a node that is gone"
        # A rank's request written just before srun ended, from another node, may reach this
        # node's view of the shared disk a little later: srun's end alone does not say "none".
        until = time.monotonic() + AFTER_SRUN_S
        while poll is not None and not polled() and time.monotonic() < until:
            time.sleep(POLL_S)
        if not acted[0] and (code != 0 or sigterm[0] or (termed is not None and termed())):
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            on_end(ended[0] or f"srun exited {code}" + " after SIGTERM" * (code == 0))
    finally:
        signal.signal(signal.SIGTERM, before)
    return code if code >= 0 else 128 - code  # killed by a signal: as the shell would say it
