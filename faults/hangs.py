"""Hung ranks: one rank of a gloo job on this machine stops (SIGSTOP) or stalls in Python, and the
watchdog of the others must end them, save the stacks and name exactly that rank.

    python -c "from faults.hangs import hung_ranks as f; print(f(__import__('pathlib').Path('/tmp/x'), 4, 0))"

Each round runs tests/hang_workload.py's `stall` as WORLD processes with torchrun-style variables
(no SLURM: nothing is requeued, and the live ranks end with status 1, which srun's
--kill-on-bad-exit would turn into the end of the step). Rounds alternate how the rank hangs:
stopped, which leaves it unable to answer, or asleep inside its step, alive but a step behind the
others. The hung rank and the step are drawn from the seed. Lost: a live rank still running
BOUND_S after the start, no report, a report naming any other ranks than the hung one, or a rank
named as having answered without its stacks file.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

from faults.common import Outcome

REPO = Path(__file__).resolve().parents[1]
WORLD = 3
WATCHDOG_S = 2.0
BOUND_S = 180.0  # start-up of WORLD interpreters with torch, on a loaded machine, then the hang
HOWS = ("stop", "sleep")


def hung_ranks(scratch: Path, rounds: int, seed: int) -> Outcome:
    sys.path.insert(0, str(REPO))
    from tests.hang_workload import launch

    rng = random.Random(seed)
    outcome = Outcome(0, 0, f"{WORLD} gloo ranks, watchdog_s={WATCHDOG_S:g}, hangs: "
                            "SIGSTOP (no answer) and asleep in a step (behind), alternately")
    for i in range(rounds):
        how, rank, step = HOWS[i % 2], rng.randrange(WORLD), rng.randrange(3, 7)
        out = Path(scratch) / f"round-{i}"
        out.mkdir(parents=True, exist_ok=True)
        cfg = {"watchdog_s": WATCHDOG_S, "stop_rank": rank, "stop_at": step, "how": how, "steps": 1000,
               "timeout_s": 600}
        outcome.add(_judge(launch("stall", WORLD, out, cfg), out, rank, how))
    return outcome


def _judge(procs: list, out: Path, rank: int, how: str) -> str:
    """'' when the round ended as it must, else what went wrong."""
    live = [p for r, p in enumerate(procs) if not (how == "stop" and r == rank)]
    try:
        for p in live:
            p.wait(timeout=BOUND_S)
    except subprocess.TimeoutExpired:
        return f"a live rank still ran {BOUND_S:.0f} s after the start ({how}, rank {rank})"
    finally:
        for p in procs:
            p.kill()
            p.wait()
    reports = list(out.glob("hangs/*/report.json"))
    if len(reports) != 1:
        return f"{len(reports)} reports ({how}, rank {rank})"
    report = json.loads(reports[0].read_text())
    if report.get("stuck") != [rank]:
        return f"report names {report.get('stuck')}, rank {rank} hung ({how})"
    silent = [r for r in report.get("answered", []) if not (reports[0].parent / f"rank-{r}.txt").is_file()]
    return f"no stacks of ranks {silent} that answered" if silent else ""
