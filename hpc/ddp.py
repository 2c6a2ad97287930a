"""One DDP session per task: init from SLURM's variables, helpers, cleanup in finally.

    with hpc.ddp.session(timeout_s=300) as s:
        model = s.wrap(Net())
        for epoch in range(3):
            s.set_epoch(epoch)
            for x, y in s.progress(s.loader(data, batch_size=16, seed=0)): ...

Backend: nccl when this task has a CUDA device, gloo otherwise. Device binding follows
hpc.runtime.devicebind.bind_device with the count torch sees (one GPU per task -> cuda:0, GPUs shared by the
node's tasks -> cuda:local_rank, also under torchrun or without CUDA_VISIBLE_DEVICES).
Rank 0 is named once (is_main); other ranks get a writer that does nothing and no progress
bar. The process group has a timeout so a rank that dies fails the others instead of
leaving them blocked in a collective. What the session offers inside (wrap, loader, collectives,
writer) is hpc.runtime.session's Session; this module joins and leaves the group.

Leaving waits for the gloo group's worker threads to go idle (settle_workers): a worker torch has
not scheduled since its collective ended still holds that collective's tensors, and if it frees them
once the interpreter has begun to end (the group outlives destroy_process_group wherever a DDP model
or torch.distributed.nn still holds it), their Python objects need the GIL: Python ends the thread
inside a C++ destructor and the whole process aborts ("terminate called without an active
exception", SIGABRT) after its work was done, on the ordinary exit and on every preemption's.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import os
import time
from pathlib import Path
from typing import Iterator

import torch
import torch.distributed as dist

from hpc.recovery.hangs import attempt_dir, flight_recorder_env
from hpc.runtime.devicebind import bind_device
from hpc.runtime.distenv import DistEnv
from hpc.runtime.envparse import from_environ
from hpc.runtime.session import NullWriter, Session
from hpc.runtime.teardown import EXIT_TIMEOUT_S, rendezvous_exit

__all__ = ["Session", "session", "NullWriter"]

log = logging.getLogger(__name__)
# Sessions this process has left normally: every rank counts alike, so it names the exit rendezvous.
# The rendezvous store outlives the group (torch's TCP store server is shared per port within a
# process), so a second session here reaches the keys of the first: the generation keeps them apart.
_generation = 0
GLOO_WORKER = "pt_gloo_runloop"  # the name torch gives each worker thread of a gloo group
SETTLE_S = 5.0  # the longest a session's exit waits for them; past it, it leaves all the same


def busy_workers() -> list[int]:
    """Thread ids of this process's gloo workers that are running or ready to run (Linux /proc;
    none where it cannot be read). An idle worker sleeps on its queue."""
    busy = []
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return busy
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                stat = f.read()
        except OSError:  # the thread has just ended
            continue
        name, state = stat[stat.find("(") + 1:stat.rfind(")")], stat[stat.rfind(")") + 2:][:1]
        if name == GLOO_WORKER and state == "R":
            busy.append(int(tid))
    return busy


def settle_workers(timeout_s: float = SETTLE_S, pause_s: float = 0.002) -> bool:
    """Wait, the GIL released, until no gloo worker is running or ready to run at three looks in a
    row; False when one still was after timeout_s. A worker waiting for the GIL takes it in a pause."""
    deadline, quiet = time.monotonic() + timeout_s, 0
    while quiet < 3:
        if time.monotonic() > deadline:
            log.warning("gloo worker threads %s still running %g s after the session ended",
                        busy_workers(), timeout_s)
            return False
        time.sleep(pause_s)
        quiet = 0 if busy_workers() else quiet + 1
    return True


def _cuda_count() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _pick_device(env: DistEnv, cuda_count: int | None = None) -> torch.device:
    """This task's device; cuda_count is torch's device count (probed when None)."""
    cuda_count = _cuda_count() if cuda_count is None else cuda_count
    index, warning = bind_device(env, cuda_count)  # raises with a HINT on tasks/GPU mismatches
    if warning:
        log.warning("%s", warning)
    if index is not None:
        return torch.device("cuda", index)
    if env.visible_devices:
        # GPUs allocated by SLURM but no CUDA here (a test cluster with fake gres): run on CPU.
        log.warning("CUDA_VISIBLE_DEVICES=%s but CUDA is not available; using the CPU",
                    ",".join(env.visible_devices))
    return torch.device("cpu")


def _trace_dir(env: DistEnv) -> Path | None:
    """The attempt's hangs/ directory of an hpc task (HPC_CHECKPOINT_DIR is <task>/checkpoints)."""
    base = os.environ.get("HPC_CHECKPOINT_DIR")
    return attempt_dir(Path(base).parent, env.job_id, env.restart_count) if base else None


def _set_precision(device: torch.device, tf32: bool) -> None:
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.backends.cudnn.allow_tf32 = tf32


@contextlib.contextmanager
def session(timeout_s: float = 600, backend: str | None = None, env: DistEnv | None = None,
            tf32: bool = True, bf16: bool = False, train_timeout_s: float | None = None) -> Iterator[Session]:
    """Initialise torch.distributed from the environment; always clean up.

    timeout_s bounds the rendezvous and every collective: a peer that died makes the others
    raise after timeout_s instead of blocking until the job's time limit. train_timeout_s, usually
    shorter, replaces it after the first training step (Session.training_started). Under NCCL the
    flight recorder keeps the last collectives and dumps them on a timeout (hpc.recovery.hangs).
    """
    env = env or from_environ()
    device = _pick_device(env)
    _set_precision(device, tf32)
    backend = backend or ("nccl" if device.type == "cuda" else "gloo")
    global _generation
    owns_group = False
    try:
        if env.world_size > 1 and not dist.is_initialized():
            if device.type == "cuda":
                torch.cuda.set_device(device)  # before init, or NCCL puts every rank on GPU 0
            if "nccl" in backend:  # NCCL reads these when the group is made; a value set already wins
                for key, value in flight_recorder_env(_trace_dir(env)).items():
                    os.environ.setdefault(key, value)
            # tcp:// with explicit rank and size: no os.environ writes needed.
            dist.init_process_group(
                backend, init_method=f"tcp://{env.master_addr}:{env.master_port}",
                rank=env.rank, world_size=env.world_size,
                timeout=datetime.timedelta(seconds=timeout_s),
            )
            owns_group = True
        yield Session(env, device, bf16=bf16, timeout_s=timeout_s, train_timeout_s=train_timeout_s)
        if owns_group and dist.is_initialized():
            # Not after an exception: a peer may be dead, and the others' teardown must not wait.
            _generation += 1
            rendezvous_exit(dist.distributed_c10d._get_default_store(), env.rank, env.world_size,
                            _generation, timeout_s=min(timeout_s, EXIT_TIMEOUT_S))
    finally:
        if owns_group and dist.is_initialized():
            dist.destroy_process_group()
        if owns_group:
            settle_workers()
