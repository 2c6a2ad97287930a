"""Resume for free: a training loop helper tying DDP session, checkpoint store and stop handling.

Usage::

    with hpc.ddp.session() as s:
        model = s.wrap(Net()); opt = torch.optim.SGD(model.parameters(), lr=0.1)
        loader = s.loader(dataset, batch_size=32)          # position saved per rank
        with TrainLoop(s, out_dir, save_every=100) as loop:
            loop.resume({"model": model, "optimizer": opt, "data": loader})  # no-op on a first run
            batches = loader.batches()
            for step in loop.steps(1000):                 # continues after the resumed step
                loss = train_step(next(batches))
                loop.log("loss", loss)                    # rank 0, no duplicated points
        # left normally: synchronous final checkpoint written, previous signal handlers back

A requeued job (SLURM_RESTART_COUNT > 0) or a resubmission into the same `out_dir` continues from
the newest valid checkpoint in ``out_dir/checkpoints``. Checkpoints hold every registered object's
state_dict, ``loop.extra`` (shared) and, per rank, the RNG states and the position of registered
data loaders (``s.loader(...)``, hpc.runtime.sampler), so a run that was stopped and resumed ends bitwise
identical to one that was not, provided its data comes from such a loader or is a function of the
step (e.g. hpc.runtime.sharding.round_robin with epoch = step // steps_per_epoch).

The model and its optimizer (one model, at most one optimizer registered) are saved through
DCP (hpc.checkpoint.dcp_engine) into the same ``step-N/`` directory under either strategy and at
any world size: each rank writes its shards (under DDP, its share of the replicated tensors),
asynchronously, and the marker comes after DCP's metadata. So every checkpoint loads under either
strategy and on any world size. A resume on another world size than the checkpoint's restores
everything that is global (model, optimizer, schedulers, the loaders' positions, ``extra``); the
per-rank RNG states cannot carry over (which rank would get which?), so every generator is
reseeded from (seed, step, rank) with a warning that says so. The global batch stays the same
when the batch is planned with ``s.plan_batch``: its gradient accumulation is re-planned.

On the pre-timeout signal or preemption every rank stops at the same step, the checkpoint is
written, rank 0 asks SLURM what happened and requeues (hpc.recovery.preemption), and every process exits.
Ranks agree on that step through an asynchronous vote read one check later (hpc.recovery.stopsignal), so
no step waits for the device. By default a check is made about every VOTE_PERIOD_S (0.1 s) of
training, whatever the step time: the vote carries each rank's time per step, and every rank
derives the next check's step from the slowest, the same on all. A stop thus comes within about
two periods and a step after the signal, while a fast step pays for one small all-reduce per
period instead of one per step. `check_every=N` checks every N steps instead.

Leaving the ``with`` block because of an exception writes no final checkpoint: the exception may
have come in the middle of a step (half an optimizer update, a NaN, a failed collective), and a
checkpoint of that state would carry the last completed step's number; a resume would silently
continue from a state that no run ever had. The newest periodic checkpoint is a consistent one,
and the background write in flight (a snapshot of a completed step) is allowed to commit. The
exit does no collective either: after an error on one rank, its peers may never join one.
Without ``with``, call ``finish()`` at the end; the signal handlers then stay installed.
"""

from __future__ import annotations

import logging
import time
import os
from pathlib import Path
from typing import Any, Iterator

import torch
import torch.distributed as dist

from hpc.recovery import preemption, watchdog
from hpc.runtime import resumepoint, rng
from hpc.runtime.scalars import PendingScalars
from hpc.recovery.stopsignal import StopFlag, StopVote
from hpc.checkpoint import SHARDED_KEY, CheckpointStore, optim_state
from hpc.checkpoint.layout import marker_files

log = logging.getLogger(__name__)


def _unwrap(obj: Any) -> Any:
    # DDP prefixes keys with "module."; saving the inner module lets a run resume with or without DDP.
    return obj.module if isinstance(obj, torch.nn.parallel.DistributedDataParallel) else obj


def _per_rank(obj: Any) -> bool:
    return bool(getattr(obj, "per_rank_state", False))  # hpc.runtime.sampler.ResumableLoader


def _new_engine(session: Any) -> Any:
    from hpc.checkpoint.dcp_engine import DcpEngine

    return DcpEngine(session)


def bitwise_ddp_kwargs() -> dict[str, Any]:
    """DDP options under which a resumed run sums gradients exactly as an uninterrupted one.

    DDP rebuilds its gradient buckets after the first iteration (in gradient-ready order), so the
    first step after a resume runs with the initial layout while the uninterrupted run is on the
    rebuilt one; gloo and NCCL add each element in an order set by its offset in the bucket, and
    the weights drift apart by ~1e-8. One parameter per bucket fixes every offset. It costs one
    all-reduce per parameter: meant for tests and small models (``s.wrap(m, **bitwise_ddp_kwargs())``).
    """
    return {"bucket_cap_mb_list": [1e-6]}  # 1 byte: every bucket closes after one tensor


VOTE_PERIOD_S = 0.1  # stop checks about this far apart: latency to stop, against a collective per step
MAX_CHECK_EVERY = 10_000


def check_interval(pace_us: int, period_s: float = VOTE_PERIOD_S) -> int:
    """Steps between stop checks for a time per step of `pace_us` (0: unknown, check at once)."""
    if pace_us <= 0:
        return 1
    return max(1, min(MAX_CHECK_EVERY, int(period_s * 1e6 / pace_us)))


class TrainLoop:
    """Step counter with periodic background checkpoints, agreed stops and resume.

    A context manager (see the module docstring): a normal exit finishes, any exit restores the
    signal handlers that were installed before the loop was made.
    """

    def __init__(self, session: Any, out_dir: str | os.PathLike, save_every: int = 100,
                 keep: int = 3, max_timeouts: int = preemption.DEFAULT_MAX_TIMEOUTS,
                 timeout_signal: str = preemption.DEFAULT_TIMEOUT_SIGNAL, check_every: int | None = None,
                 tensorboard: bool = True, seed: int = 0, watchdog_s: float | None = None) -> None:
        if save_every < 1 or (check_every is not None and check_every < 1):
            raise ValueError(f"save_every={save_every}, check_every={check_every}; expected >= 1. "
                             "HINT: save_every=100 saves every 100 steps; check_every=None (default) "
                             f"checks for a stop about every {VOTE_PERIOD_S} s.")
        self.s, self.out_dir = session, Path(out_dir)
        self.save_every, self.check_every, self.max_timeouts = save_every, check_every, max_timeouts
        self.store = CheckpointStore(self.out_dir / "checkpoints", keep=keep, rank=session.rank,
                                     world_size=session.world_size)
        self.flag = StopFlag(timeout_signal).install()
        self.vote = StopVote(self.flag, device=session.device)
        self._finished = False
        self.objects: dict[str, Any] = {}
        self.extra: dict[str, Any] = {}  # small plain values saved with every checkpoint
        self.step = 0  # last completed step
        self.current = 0  # step being run inside the loop body
        self.resumed_step = 0
        self._saved_step: int | None = None
        self._tb = tensorboard
        self._writer: Any = None
        self._scalars = PendingScalars()  # logged device values on their way to the host
        self.seed = seed  # reseeds the RNGs when a resume changes the world size
        self._engine: Any = None  # hpc.checkpoint.dcp_engine.DcpEngine, for a model sharded by FSDP
        self._dcp_names: tuple[str, ...] = ()  # model (and optimizer) saved through it
        self._next_check: int | None = None  # step of the next stop check (check_every=None)
        self._last_check: tuple[float, int] | None = None  # (time, step) of this rank's last check
        # ends a hung job and requeues it (hpc.recovery.watchdog); None when watchdog_s (HPC_WATCHDOG_S) is 0
        self.watchdog = watchdog.for_loop(self, watchdog_s)

    # ---------------------------------------------------------------- resume
    def resume(self, objects: dict[str, Any]) -> int:
        """Register stateful objects (state_dict/load_state_dict) and load the newest checkpoint.

        Returns the step to continue after (0 on a first run).
        """
        self.objects = dict(objects)
        state = resumepoint.agreed_state(self.store, self.s, self._load_shards)
        step = state["step"] if state else -1
        sharded = state.get(SHARDED_KEY) if state else None
        if sharded is not None or resumepoint.through_dcp(self.objects):
            self._dcp_names = resumepoint.sharded_objects(self.objects)
            self._engine = self._engine or _new_engine(self.s)  # collective: every rank, here
            for name in self._dcp_names[1:]:  # the optimizer: a save then knows whether an empty
                optim_state.watch(self.objects[name])  # state is all it keeps
        if step < 0:
            log.info("no checkpoint in %s: starting fresh", self.store.directory)
            return 0
        mine = state.get("per_rank") or {}
        saved_world = state.get("world_size", self.s.world_size)
        for name, obj in self.objects.items():
            if name in self._dcp_names and sharded is not None:
                continue
            if _per_rank(obj) and saved_world != self.s.world_size:
                log.warning("checkpoint step %d was written by %d ranks: the per-rank state of %r "
                            "cannot carry over to %d; it starts fresh", step, saved_world, name,
                            self.s.world_size)
                continue
            saved = (mine.get("objects", {}) if _per_rank(obj) else state["objects"]).get(name)
            if saved is None and not _per_rank(obj):  # a loader position, written per rank before
                saved = mine.get("objects", {}).get(name)  # positions were global
            if saved is None:  # e.g. a data loader registered after this checkpoint was written
                log.warning("checkpoint step %d has no state for %r: it starts fresh", step, name)
                continue
            _unwrap(obj).load_state_dict(saved)
        self.extra = dict(state.get("extra", {}))
        if saved_world == self.s.world_size and mine:
            rng.restore(mine["rng"])
        else:
            rng.seed_all(rng.derive_seed(self.seed, step, self.s.rank))
            log.warning("checkpoint step %d was written by %d ranks, this run has %d: per-rank RNG "
                        "states cannot carry over, so every generator is reseeded from (seed=%d, "
                        "step=%d, rank). Model, optimizer and data position resume exactly; random "
                        "draws (dropout, augmentation) differ from an uninterrupted run's",
                        step, saved_world, self.s.world_size, self.seed, step)
        self.step = self.current = self.resumed_step = self._saved_step = step
        log.info("resumed from step %d (SLURM_RESTART_COUNT=%s)", step,
                 os.environ.get("SLURM_RESTART_COUNT", "0"))
        return step

    def _save_shards(self, directory: Path, blocking: bool) -> Any:
        """The store's hook: DCP writes the model and optimizer into the checkpoint directory."""
        # Without DCP's collectives: the store's commit merges the ranks' indexes (dcp_engine).
        self._engine.save(directory, *(self.objects[n] for n in self._dcp_names), blocking=blocking,
                          collectives=False)
        return self._engine.wait

    def _load_shards(self, where: Path) -> str:
        """Load the model (and optimizer) from DCP's shards at `where`, checking each byte read
        against the marker's checksums; '' when they match, else what did not."""
        from hpc.checkpoint.dcp_engine import ShardCorrupt

        self._dcp_names = resumepoint.sharded_objects(self.objects)
        self._engine = self._engine or _new_engine(self.s)  # collective: every rank, here
        try:
            self._engine.load(where, *(self.objects[n] for n in self._dcp_names), files=marker_files(where))
        except (ShardCorrupt, FileNotFoundError) as err:
            return str(err)
        return ""

    # ------------------------------------------------------------------ loop
    def steps(self, total: int) -> Iterator[int]:
        """Yield steps resumed+1 .. total; after each: periodic save and the agreed stop check.
        The watchdog watches from the first step's end to the last's."""
        try:
            for step in range(self.step + 1, total + 1):
                self.current = step
                yield step
                self.step = step
                self.watchdog.beat(step) if self.watchdog else None
                if step == self.resumed_step + 1:
                    self.s.training_started()  # the training collective timeout from here on
                if step == total:  # done: finish() writes the final checkpoint, no stop needed
                    break
                if step % self.save_every == 0:
                    self.save()
                if self._check_due(step):
                    request = self.vote.poll(pace=self._pace(step))
                    self._next_check = step + self._interval()
                    if request:
                        self._stop(request)
        finally:
            self.watchdog.rest() if self.watchdog else None

    def _check_due(self, step: int) -> bool:
        if self.check_every is not None:
            return step % self.check_every == 0
        return self._next_check is None or step >= self._next_check

    def _pace(self, step: int) -> int:
        """This rank's microseconds per step since its last check (0 at the first)."""
        now, (then, before) = time.perf_counter(), self._last_check or (0.0, step)
        self._last_check = (now, step)
        return int((now - then) * 1e6 / (step - before)) if step > before else 0

    def _interval(self) -> int:
        """Steps to the next check: the same on every rank, from the vote's agreed (slowest) pace.
        One process checks every step: its vote is a local read, no collective."""
        if self.check_every is not None:
            return self.check_every
        return check_interval(self.vote.agreed_pace) if self.vote.distributed() else 1

    def state(self) -> dict[str, Any]:
        """Shared objects (model, optimizer: equal on every rank) go in rank 0's file; objects
        marked ``per_rank_state`` (data loader positions) and the RNGs in each rank's own."""
        split = {True: {}, False: {}}
        for k, o in self.objects.items():
            if k not in self._dcp_names:  # those are saved by DCP
                split[_per_rank(o)][k] = _unwrap(o).state_dict()
        return {"step": self.step, "extra": dict(self.extra), "objects": split[False],
                "world_size": self.s.world_size,
                "per_rank": {"rng": rng.capture(), "objects": split[True]}}

    def save(self, blocking: bool = False) -> None:
        if self._saved_step == self.step:
            self.store.wait() if blocking else None
            return
        shards = self._save_shards if self._engine is not None and self._dcp_names else None
        self.store.save(self.step, self.state(), blocking=blocking, sharded=shards)
        self._saved_step = self.step

    def _stop(self, request: preemption.StopRequest) -> None:
        log.warning("stopping at step %d: %s (signal %s on this rank)", self.step, request.reason,
                    request.signal)
        self.vote.close()  # every rank launched the vote in flight: let it end before exiting
        self.watchdog.stop() if self.watchdog else None
        self.save(blocking=True)
        self.s.barrier()  # rank 0 has committed the checkpoint before anyone is requeued
        decision = None
        if self.s.is_main:
            decision = preemption.handle_stop(request, self.store.directory / "requeue.json",
                                              max_timeouts=self.max_timeouts)
        decision = self._broadcast(decision)
        self.close_writer()
        preemption.exit_for(decision)

    def _broadcast(self, obj: Any) -> Any:
        if not self.s.distributed:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0, device=self.s.device)
        return box[0]

    def finish(self) -> None:
        """Synchronous final checkpoint; every rank returns after rank 0 committed it. Once."""
        if self._finished:
            return
        self.watchdog.stop() if self.watchdog else None
        self.vote.close()
        self.save(blocking=True)
        self.s.barrier()
        self.store.close()
        self._close_engine()
        self.close_writer()
        self._finished = True
        # Without `with`, the flag handlers stay: a time-limit signal or SIGTERM arriving before
        # the process exits must not kill it by default action before submitit records the result.

    def __enter__(self) -> "TrainLoop":
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        try:
            if exc_type is None:
                self.finish()
            else:
                self._abandon(exc)
        finally:
            self.flag.uninstall()

    def _abandon(self, exc: BaseException) -> None:
        """Exit on an exception (a stop's SystemExit included): no final checkpoint, no collective."""
        if self.watchdog is not None:
            self.watchdog.wait_for_end()  # in a hang, the watchdog's verdict ends the process
            self.watchdog.stop()
        self.vote.abandon()
        if not isinstance(exc, (SystemExit, preemption.JobNotRequeued)):
            log.warning("leaving the training loop at step %d on %s: no final checkpoint, the "
                        "newest periodic one stays", self.step, type(exc).__name__)
        try:
            self.store.close()  # lets the write in flight commit: it holds a completed step
        except Exception as err:  # never hide the exception that ended the loop
            log.warning("background checkpoint write failed while leaving: %s", err)
        self._engine = None  # no collective here: its group goes with the process
        self.close_writer()
        self._finished = True

    def _close_engine(self) -> None:
        if self._engine is not None:
            self._engine.close()
            self._engine = None

    # --------------------------------------------------------------- logging
    @property
    def writer(self) -> Any:
        """TensorBoard writer continuing the same run: points after the checkpoint are purged."""
        if self._writer is None:
            if self._tb:
                # purge_step drops events at or after it, logged by the attempt that was stopped
                # after its last checkpoint; they are logged again, once, by this attempt.
                purge = self.resumed_step + 1 if self.resumed_step else None
                self._writer = self.s.writer(self.out_dir / "tensorboard", purge_step=purge)
            else:
                from hpc.ddp import NullWriter

                self._writer = NullWriter()
        return self._writer

    def log(self, tag: str, value: Any, step: int | None = None) -> None:
        """Scalar on rank 0 at `step` (default: the current step); steps <= resumed are skipped."""
        step = self.current if step is None else step
        if step > self.resumed_step and self._tb and self.s.is_main:  # elsewhere: no device wait
            self._scalars.add(self.writer.add_scalar, tag, value, step)  # hpc.runtime.scalars: never waits

    def close_writer(self) -> None:
        if self._writer is not None:
            self._scalars.flush(block=True)
            self._writer.close()
