"""A full disk under the checkpoint store: a small tmpfs, filled by a ballast file.

    python -m faults.disk /tmp/scratch 3 0     # 3 rounds, seed 0; prints the outcome as JSON

Mounting a tmpfs needs root, or at least CAP_SYS_ADMIN. Where `mount` is refused (a container
without that capability), the campaign runs again in a child inside a new user and mount namespace
(`unshare --user --map-root-user --mount`), where an unprivileged process may mount a tmpfs. Where
both are refused, full_disk raises MountRefused naming both reasons, and callers report the
campaign as not run.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Iterator

from faults.common import SIZE, Outcome, consistency, expected_state
from hpc.checkpoint import CheckpointStore

REPO = Path(__file__).resolve().parent.parent
UNSHARE = ["unshare", "--user", "--map-root-user", "--mount"]

MODES = ("thread", "fork", "blocking")


class MountRefused(RuntimeError):
    """No tmpfs could be mounted here; the message says why."""


@contextlib.contextmanager
def tmpfs(path: Path, size: str = "8m") -> Iterator[Path]:
    """A tmpfs of `size` mounted on `path` for the block; unmounted afterwards, also on errors."""
    path.mkdir(parents=True, exist_ok=True)
    try:
        out = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                             capture_output=True, text=True)
    except FileNotFoundError:
        raise MountRefused("no mount command here") from None
    if out.returncode:
        raise MountRefused(f"cannot mount a tmpfs on {path}: {(out.stderr or out.stdout).strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


def fill(directory: Path, leave: int) -> Path:
    """A ballast file that leaves about `leave` bytes free on the filesystem of `directory`."""
    st = os.statvfs(directory)
    ballast = directory / "ballast"
    with open(ballast, "wb") as f:
        f.truncate(0)
        os.posix_fallocate(f.fileno(), 0, max(0, st.f_bavail * st.f_frsize - leave))
    return ballast


def leftovers(directory: Path) -> list[str]:
    """Partial files and temporary directories a failed save must not leave behind."""
    return sorted(str(p.relative_to(directory)) for p in directory.rglob("*")
                  if p.name.endswith(".part") or p.name.endswith(".tmp"))


def save_on_full_disk(directory: Path, mode: str, step: int) -> str:
    """One save (of SIZE floats) that cannot fit: '' when it fails saying so and leaves nothing
    behind, else what went wrong."""
    store = CheckpointStore(directory, keep=1, mode=None if mode == "blocking" else mode)
    try:
        store.save(step, expected_state(step), blocking=mode == "blocking")
        store.wait()
        return "the save did not fail"
    except (OSError, RuntimeError) as err:
        text = str(err)
        if "no space left" not in text or "bytes needed" not in text or "bytes free" not in text:
            return f"the error does not say no space left, bytes needed and free: {text[:300]}"
    finally:
        store.close()  # the failed write was already reported: nothing is left to wait for
    left = leftovers(directory)
    return f"left behind: {left}" if left else ""


def _loads(directory: Path, step: int) -> str:
    """'' when the newest checkpoint is `step`, whole. Its own frame: loads are memory-mapped, and
    a deleted checkpoint's pages stay on the tmpfs while a tensor of it lives, which the failed
    save's traceback would make last (it holds the frames that called the save)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        state = CheckpointStore(directory).load()
    return consistency(state) or ("" if state["step"] == step else f"step {state['step']} loads, not {step}")


def disk_round(disk: Path, i: int, mode: str, rnd: random.Random) -> str:
    """One round on the mounted `disk`: '' when nothing was lost, else what went wrong."""
    directory = disk / f"store-{i}"
    store = CheckpointStore(directory, keep=1)
    store.save(1, expected_state(1), blocking=True)
    store.close()
    ballast = fill(disk, rnd.randint(0, SIZE * 4 - 65536))  # less than the next save needs
    problem = save_on_full_disk(directory, mode, 2) or _loads(directory, 1)
    ballast.unlink()
    store = CheckpointStore(directory, keep=1, mode=None if mode == "blocking" else mode)
    try:
        store.save(3, expected_state(3), blocking=mode == "blocking")
        store.close()
        problem = problem or _loads(directory, 3)
    except (OSError, RuntimeError) as err:
        problem = problem or f"the save after freeing space failed: {err}"
    entries = [p.name for p in directory.iterdir() if p.name != ".writer.lock"]
    shutil.rmtree(directory)
    return problem or ("" if entries == ["step-3"] else f"entries after the next save: {entries}")


def full_disk(scratch: Path, rounds: int, seed: int, namespace: bool | None = None) -> Outcome:
    """Each round: a store on an 8 MiB tmpfs holds one checkpoint, a ballast file leaves less room
    than the next save needs, the save fails (thread, fork or blocking). Lost: a misleading error,
    a partial write left behind, the previous checkpoint not loading, or the next save failing
    once the ballast is gone. `namespace`: True mounts in a user namespace (a child process),
    False only here, None here or else there."""
    if namespace:
        return _in_namespace(scratch, rounds, seed, "asked for")
    rnd = random.Random(seed)
    outcome = Outcome(0, 0, f"8 MiB tmpfs, modes {', '.join(MODES)}")
    try:
        with tmpfs(scratch / "small-disk") as disk:
            for i in range(rounds):
                outcome.add(disk_round(disk, i, MODES[i % len(MODES)], rnd))
    except MountRefused as err:
        if namespace is False:
            raise
        return _in_namespace(scratch, rounds, seed, str(err))
    return outcome


def _in_namespace(scratch: Path, rounds: int, seed: int, why: str) -> Outcome:
    """full_disk in a child inside a new user and mount namespace, where mounting is allowed."""
    argv = [*UNSHARE, sys.executable, "-m", "faults.disk", str(scratch), str(rounds), str(seed)]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    try:
        out = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=REPO, timeout=600)
    except FileNotFoundError:
        raise MountRefused(f"{why}; and there is no unshare command for a user namespace") from None
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
    if out.returncode or not lines:
        last = (out.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise MountRefused(f"{why}; and in a user namespace (unshare exited {out.returncode}): {last}")
    result = Outcome(**json.loads(lines[-1]))
    result.detail += f"; mounted in a user namespace ({why})"
    return result


if __name__ == "__main__":  # the child of _in_namespace
    found = full_disk(Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), namespace=False)
    print(json.dumps(found.__dict__), flush=True)
