"""Fault campaigns against the checkpoint store: kills during saves and renames, readers during
pruning, a second writer, malformed entries.

    python -m faults.reliability          # every campaign with its full count, writes RELIABILITY.md

Each campaign takes (scratch directory, count, seed) and returns a faults.common.Outcome.
"Lost" means a checkpoint that was committed (its save returned) and then did not load, a load that
raised or returned anything but one complete checkpoint, or a second writer that was let in.
"""

from __future__ import annotations

import os
import random
import signal
import time
import warnings
from pathlib import Path

from faults.common import (Outcome, Victim, committed, consistency, expected_state, quiet_load,
                                 save_forever)
from hpc.checkpoint import CheckpointStore

WRITER_MODES = ("thread", "fork", "blocking")


def sigkill_saves(scratch: Path, kills: int, seed: int, mode: str = "thread") -> Outcome:
    """SIGKILL a writer saving every step (keep=2) at a random moment, `kills` times; each next
    writer resumes from what the last one left. Lost: the newest committed step does not load, or
    what loads mixes steps."""
    rnd, directory = random.Random(seed), scratch / f"sigkill-{mode}-{seed}"
    outcome = Outcome(0, 0, f"writer mode {mode}, keep=2, 1 MiB per save")
    for _ in range(kills):
        victim = Victim(save_forever, directory, mode, 2)
        time.sleep(rnd.uniform(0.0, 0.15))
        lines = victim.kill()
        done, state = committed(lines), quiet_load(directory)
        problem = next((ln for ln in lines if ln.startswith("resumed") and len(ln.split()) > 2), "")
        if done is not None and (state is None or state["step"] < done):
            problem = f"step {done} was committed, {state and state['step']} loads"
        outcome.add(problem or (consistency(state) if state else ""))
    return outcome


def readers_during_prune(scratch: Path, loads: int, seed: int) -> Outcome:
    """load() `loads` times while a writer saves every step and prunes with keep=1. The faults are
    the prunes that happened under the readers (a read is the probe, not a fault). Lost: a load
    that raised, returned None, or returned a mix of two checkpoints (each counted, and never more
    than the prunes they met, plus one)."""
    directory = scratch / f"readers-{seed}"
    writer = Victim(save_forever, directory, "thread", 1)
    if not writer.wait_for("committed"):
        raise RuntimeError(f"the writer exited before its first checkpoint: {writer.finish()}")
    seen: set = set()
    problems: list[str] = []
    try:
        for _ in range(loads):
            try:
                state = quiet_load(directory)
                problem = consistency(state)
                if state:
                    seen.add(state["step"])
            except Exception as err:  # counted, not raised: the campaign reports every kind
                problem = f"{type(err).__name__}: {err}"
            if problem:
                problems.append(problem)
    finally:
        writer.kill()
    prunes = max(seen) - min(seen) if seen else 0  # keep=1: every commit after the first pruned one
    outcome = Outcome(prunes, min(len(problems), prunes + 1),
                      f"{loads} loads (keep=1) met {prunes} prunes, {len(seen)} distinct checkpoints read")
    if problems:
        outcome.detail += f"; {len(problems)} bad loads, first: {problems[0]}"
    return outcome


def _try_to_write(out, directory: Path, rank: int) -> None:
    import hpc.checkpoint.writer_lock as lock

    lock.OWNER_WAIT_S = 1.0  # a rank > 0 waits this long for its own rank 0 to hold the lock
    os.environ["SLURM_JOB_ID"] = f"second-{os.getpid()}"  # another job
    try:
        CheckpointStore(directory, rank=rank, world_size=2 if rank else 1).save(
            10**6, {"x": 1, "per_rank": {"pos": 0}} if rank else {"x": 1}, blocking=True)
        out.write("saved\n")
    except Exception as err:  # reported whatever it is: only a refusal naming the holder passes
        out.write(f"refused {type(err).__name__}: {err}\n".replace("\n", " ").rstrip() + "\n")


def second_writer_problem(directory: Path, rank: int, job: str, pid: int) -> str:
    """'' when a second job's rank `rank` is refused by the live writer (SLURM job `job`, `pid`)
    with a message naming job, host and pid, and writes nothing; else what went wrong."""
    lines = Victim(_try_to_write, directory, rank).finish()
    said = lines[0] if lines else "(nothing)"
    if not said.startswith("refused StoreLocked") or not all(
            w in said for w in (f"job {job}", f"pid {pid}", f"host {os.uname().nodename}")):
        return f"second writer (rank {rank}) not refused naming job {job}, host and pid {pid}: {said}"
    if any(directory.glob(f"*step-{10**6}*")):
        return "the refused writer wrote into the store"
    return ""


def two_writers(scratch: Path, rounds: int, seed: int) -> Outcome:
    """A second job (its rank 0, or its rank 1) saves into a store that a live writer holds: it
    must be refused, naming the holder, and write nothing. Then the holder is SIGKILLed: its lock
    must not block the next writer, which resumes from the holder's newest commit. Two faults
    per round."""
    outcome = Outcome(0, 0, "refused while the holder lives, free once it is killed")
    for i in range(rounds):
        directory, job = scratch / f"writers-{seed}-{i}", f"{4000 + i}"
        holder = Victim(save_forever, directory, "thread", 2, job)
        if not holder.wait_for("committed"):
            raise RuntimeError(f"the holder exited before its first checkpoint: {holder.finish()}")
        outcome.add(second_writer_problem(directory, i % 2, job, holder.proc.pid))
        done = committed(holder.kill())
        after = Victim(save_forever, directory, "blocking", 2)
        resumed, first = after.wait_for("resumed").split()[1:2], after.wait_for("committed")
        lines = after.kill()
        problem = "" if first else f"the next writer could not save after the holder died: {lines}"
        if not resumed or int(resumed[0]) < (done or 0):
            problem = f"after the holder's death the next writer resumed from {resumed}, expected {done}"
        outcome.add(problem)
    return outcome


def _save_and_die(out, directory: Path, mode: str, point: str) -> None:
    """Hold step 4 and step 5 (copy 1), then save step 5 again (copy 2) and SIGKILL the whole
    group at `point` of its two renames: before the first, between them, or after both."""
    store = CheckpointStore(directory, keep=3, mode=None if mode == "blocking" else mode)
    store.save(4, expected_state(4), blocking=True)
    store.save(5, expected_state(5, copy=1), blocking=True)
    replace = os.replace

    def dying_replace(src, dst):
        src, dst = Path(src), Path(dst)
        if point == "before" and dst.name == ".step-5.old":
            os.killpg(0, signal.SIGKILL)
        replace(src, dst)
        if (point, dst.name) in (("between", ".step-5.old"), ("after", "step-5")) and \
                (point == "between" or src.name == ".step-5.tmp"):
            os.killpg(0, signal.SIGKILL)

    os.replace = dying_replace  # this process (and a writer forked from it) only
    out.write("re-saving\n")
    store.save(5, expected_state(5, copy=2), blocking=mode == "blocking")
    store.wait()
    out.write("not killed\n")


KILL_POINTS = ("before", "between", "after")


def resave_problem(directory: Path, mode: str, point: str) -> str:
    """'' when a re-save of step 5 killed at `point` leaves step 5 loadable (the new copy once it
    is complete), warned about truthfully, and the next writer's first save recovers it."""
    lines = Victim(_save_and_die, directory, mode, point).finish()
    if lines != ["re-saving"]:
        return f"the writer was not killed at its renames ({point}, {mode}): {lines}"
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        state = CheckpointStore(directory).load()
    copies = (1, 2) if point == "before" else (2,)  # before the renames both copies are complete
    if consistency(state) or state["step"] != 5 or state["copy"] not in copies:
        return (f"killed {point} the renames ({mode}): loaded step {state and state['step']} copy "
                f"{state and state['copy']}, expected step 5 copy {copies} ({consistency(state)})")
    wrong = [str(w.message) for w in said if "no completion marker" in str(w.message)]
    if wrong:
        return f"killed {point} the renames ({mode}): the warning misnames a complete copy: {wrong[0]}"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        store = CheckpointStore(directory, keep=3)
        store.save(6, expected_state(6), blocking=True)
        store.close()
        again = store.load(step=5)
    left = sorted(p.name for p in directory.iterdir() if p.name.startswith("."))
    if again is None or again["copy"] != 2 or left != [".writer.lock"]:
        return (f"killed {point} the renames ({mode}): after the next save step 5 is copy "
                f"{again and again['copy']}, entries {left}")
    return ""


def kill_between_renames(scratch: Path, rounds: int, seed: int) -> Outcome:
    """A re-save of a step (after a resume from an older one) swaps two directories with two
    renames; SIGKILL it before, between and after them, in every writer mode."""
    outcome = Outcome(0, 0, f"kill points {', '.join(KILL_POINTS)}; modes {', '.join(WRITER_MODES)}")
    for i in range(rounds):
        mode, point = WRITER_MODES[i % 3], KILL_POINTS[(i // 3) % 3]
        outcome.add(resave_problem(scratch / f"renames-{seed}-{i}", mode, point))
    return outcome


def _malformed(directory: Path, step: int, kind: str, rnd: random.Random) -> None:
    """Put one malformed entry named for `step` into a store: `kind` is one of MALFORMED, or
    "marker <text>" for a marker holding that text."""
    entry = directory / f"step-{step}"
    if kind == "regular file":
        entry.write_bytes(rnd.randbytes(rnd.randint(0, 64)))
        return
    entry.mkdir()
    marker, shared = entry / "COMPLETE.json", entry / "shared.pt"
    shared.write_bytes(b"x")
    if kind == "marker directory":
        marker.mkdir()
    elif kind == "shared.pt directory":
        shared.unlink()
        shared.mkdir()
        marker.write_text('{"step": %d, "files": {"shared.pt": {"crc32": "0", "bytes": 1}}}' % step)
    elif kind == "random bytes marker":
        marker.write_bytes(rnd.randbytes(rnd.randint(0, 64)))
    else:  # a marker of the wrong shape
        marker.write_text(kind.removeprefix("marker ") if kind.startswith("marker ") else rnd.choice(MALFORMED_JSON))


MALFORMED = ("regular file", "marker directory", "shared.pt directory", "random bytes marker", "json")
MALFORMED_JSON = ("[]", "null", "1", '"x"', "{}", '{"files": []}', '{"files": {"shared.pt": 5}}',
                  '{"files": {"../../x": "0", "shared.pt": "0"}}',
                  '{"files": {"shared.pt": {"crc32": 1, "bytes": "1"}}}')


def malformed_problem(directory: Path, steps: dict[int, str], rnd: random.Random) -> str:
    """'' when a store holding step 1 and malformed entries at `steps` (step -> kind) loads step 1
    without raising, and its next save (step 9, keep=1) leaves only step 9; else what went wrong."""
    store = CheckpointStore(directory, keep=1)
    store.save(1, expected_state(1), blocking=True)
    for step, kind in steps.items():
        _malformed(directory, step, kind, rnd)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            state = store.load()
            if consistency(state) or state["step"] != 1:
                return f"{steps}: loaded {state and state['step']} instead of step 1"
            store.save(9, expected_state(9), blocking=True)
            state = store.load()
            if consistency(state) or state["step"] != 9 or store.steps() != [9]:
                return f"{steps}: after a save, steps {store.steps()} and step {state and state['step']} loads"
    except Exception as err:  # counted: the campaign reports every kind of failure
        return f"{steps}: {type(err).__name__}: {err}"
    finally:
        store.close()
    return ""


def malformed_entries(scratch: Path, cases: int, seed: int) -> Outcome:
    """Malformed step-N entries newer than the valid checkpoint: load() must skip them (return the
    valid one, never raise), and the writer's next save must remove them."""
    rnd, outcome = random.Random(seed), Outcome(0, 0, f"kinds: {', '.join(MALFORMED)}")
    for i in range(cases):
        steps = {s: rnd.choice(MALFORMED) for s in rnd.sample(range(2, 9), rnd.randint(1, 3))}
        outcome.add(malformed_problem(scratch / f"malformed-{seed}-{i}", steps, rnd))
    return outcome
