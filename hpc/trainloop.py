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
the newest valid checkpoint in ``out_dir/checkpoints``: every registered object's state_dict,
``loop.extra``, and per rank the RNG states and the loaders' positions, so a stopped and resumed run
ends bitwise identical to one that was not. The model and its optimizer go through DCP
(hpc.checkpoint.dcp_engine): every checkpoint loads under either strategy and on any world size
(hpc.runtime.resumepoint); the per-rank RNG states are then reseeded from (seed, step, rank).

On the pre-timeout signal or preemption every rank stops at the same step (an asynchronous vote
about every VOTE_PERIOD_S of training, hpc.recovery.stopsignal), the checkpoint is written, rank 0
asks SLURM what happened and requeues (hpc.recovery.preemption), and every process exits.
Leaving the ``with`` block by an exception writes no final checkpoint (the state may be half a
step) and makes no collective; the newest periodic checkpoint stays the one to resume from.
Without ``with``, call ``finish()`` at the end. docs/distributed.md and docs/recovery.md say more.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any, Iterator

import torch.distributed as dist

from hpc.checkpoint import SHARDED_KEY, CheckpointStore
from hpc.recovery import hangs, preemption, stopsignal, watchdog
from hpc.recovery.stopsignal import StopFlag, StopVote
from hpc.rundir import attempts, notify
from hpc.runtime import loopstate, resumepoint
from hpc.runtime.loopshards import LoopShards
from hpc.runtime.scalars import StepLog

log = logging.getLogger(__name__)


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
                             f"checks for a stop about every {stopsignal.VOTE_PERIOD_S} s.")
        self.s, self.out_dir = session, Path(out_dir)
        self.save_every, self.max_timeouts = save_every, max_timeouts
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
        self.scalars = StepLog(session, self.out_dir / "tensorboard", lambda: self.resumed_step, tensorboard)
        self.seed = seed  # reseeds the RNGs when a resume changes the world size
        self.shards = LoopShards(session)  # the model (and optimizer) saved through DCP (hpc.runtime.loopshards)
        self.checks = stopsignal.CheckSchedule(self.vote, check_every)  # the steps that poll the vote
        # ends a hung job and requeues it (hpc.recovery.watchdog); None when watchdog_s (HPC_WATCHDOG_S) is 0
        self.watchdog = watchdog.for_loop(self, watchdog_s)
        # rank 0's record of this attempt: software, first step, checkpoint stalls, end (hpc.rundir.attempts)
        self.attempt = attempts.AttemptLog.here(self.out_dir, session.is_main)
        # its verdict ends the process: told first, by whichever rank exits first (the one that decided,
        # whose requeue may end rank 0 before rank 0 reads the verdict); the claim on disk sends it once
        if self.watchdog is not None:
            self.watchdog.exit = self._told_hang(self.watchdog.exit)

    # ---------------------------------------------------------------- resume
    def resume(self, objects: dict[str, Any]) -> int:
        """Register stateful objects (state_dict/load_state_dict) and load the newest checkpoint.

        Returns the step to continue after (0 on a first run).
        """
        self.objects = dict(objects)
        self.attempt.start()  # refuses a resume onto changed software under resume.same_software=require
        state = resumepoint.agreed_state(self.store, self.s, self._load_shards)
        step = state["step"] if state else -1
        sharded = state.get(SHARDED_KEY) if state else None
        self.shards.take(self.objects, sharded)
        if step < 0:
            log.info("no checkpoint in %s: starting fresh", self.store.directory)
            return 0
        loopstate.restore(self.objects, state, self.shards.names if sharded is not None else (),
                          self.s.world_size, self.s.rank, self.seed)
        self.extra = dict(state.get("extra", {}))
        self.step = self.current = self.resumed_step = self._saved_step = step
        self.attempt.resumed(step)  # rank 0: a later look at the run knows which steps were redone
        log.info("resumed from step %d (SLURM_RESTART_COUNT=%s)", step,
                 os.environ.get("SLURM_RESTART_COUNT", "0"))
        return step

    def _load_shards(self, where: Path, files: dict | None = None) -> str:
        """resumepoint's hook: the registered model (and optimizer) from DCP's shards at `where`."""
        return self.shards.load(self.objects, where, files)

    # ------------------------------------------------------------------ loop
    def steps(self, total: int) -> Iterator[int]:
        """Yield steps resumed+1 .. total; after each: periodic save and the agreed stop check.
        The watchdog watches from the first step's end to the last's."""
        self.attempt.start()
        try:
            for step in range(self.step + 1, total + 1):
                self.current = step
                self.attempt.first_step()
                yield step
                self.step = step
                self.watchdog.beat(step) if self.watchdog else None
                if step == self.resumed_step + 1:
                    self.s.training_started()  # the training collective timeout from here on
                if step == total:  # done: finish() writes the final checkpoint, no stop needed
                    break
                if step % self.save_every == 0:
                    self.save()
                request = self.checks.poll(step) if self.checks.due(step) else None
                if request:
                    self._stop(request)
        finally:
            self.watchdog.rest() if self.watchdog else None

    def state(self) -> dict[str, Any]:
        """What a checkpoint of the current step saves besides DCP's shards (hpc.runtime.loopstate)."""
        return loopstate.capture(self.objects, self.shards.names, self.step, self.extra, self.s.world_size)

    def save(self, blocking: bool = False) -> None:
        if self._saved_step == self.step:
            self.store.wait() if blocking else None
            return
        held = time.monotonic()
        self.store.save(self.step, self.state(), blocking=blocking, sharded=self.shards.saver(self.objects))
        self.attempt.saved(self.step, time.monotonic() - held)  # rank 0, where it already writes
        self._saved_step = self.step

    def _stop(self, request: preemption.StopRequest) -> None:
        log.warning("stopping at step %d: %s (signal %s on this rank)", self.step, request.reason,
                    request.signal)
        self.vote.close()  # every rank launched the vote in flight: let it end before exiting
        self.watchdog.stop() if self.watchdog else None
        self.save(blocking=True)
        self.attempt.ended("stopped", self.step, stop=request.reason)
        self.s.barrier()  # rank 0 has committed the checkpoint before anyone is requeued
        decision = None
        if self.s.is_main:
            decision = preemption.handle_stop(request, self.store.directory / "requeue.json",
                                              max_timeouts=self.max_timeouts)
        decision = self._broadcast(decision)
        if self.s.is_main:  # requeued, or the time-limit cap reached: the run's sinks hear it (hpc.rundir.notify)
            notify.stop(self.out_dir, decision, notify.task_key(self.out_dir), *self._attempt_id())
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
        held, counted = time.monotonic(), self.attempt.stall_s
        self.save(blocking=True)
        self.s.barrier()
        self.store.close()  # the final write's wait is a checkpoint stall too, not training
        self.attempt.ended("completed", self.step, time.monotonic() - held - (self.attempt.stall_s - counted))
        self.shards.close()
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
        self.attempt.ended("stopped" if isinstance(exc, SystemExit) else "failed", self.step)
        if not isinstance(exc, (SystemExit, preemption.JobNotRequeued)):
            log.warning("leaving the training loop at step %d on %s: no final checkpoint, the "
                        "newest periodic one stays", self.step, type(exc).__name__)
        try:
            self.store.close()  # lets the write in flight commit: it holds a completed step
        except Exception as err:  # never hide the exception that ended the loop
            log.warning("background checkpoint write failed while leaving: %s", err)
        self.shards.drop()  # no collective here: its group goes with the process
        self.close_writer()
        self._finished = True

    def _told_hang(self, end: Any) -> Any:
        """The watchdog's exit, after the run's sinks have heard its verdict (the stuck ranks and hosts,
        hpc.recovery.hangs): the process ends by os._exit, so the message is waited for here."""
        def told(code: int) -> Any:
            verdict = hangs.summary(self.out_dir) or "no verdict written"
            notify.send(self.out_dir, "hang", "-".join(map(str, self._attempt_id())),
                        f"{verdict}; {'requeued' if code == 0 else 'not requeued'}", notify.task_key(self.out_dir))
            notify.wait()
            return end(code)
        return told

    def _attempt_id(self) -> tuple:
        return self.attempt.entry["job"], self.attempt.entry["restart"]

    # --------------------------------------------------------------- logging
    @property
    def writer(self) -> Any:
        """TensorBoard writer continuing the same run: points after the checkpoint are purged."""
        return self.scalars.writer

    def log(self, tag: str, value: Any, step: int | None = None) -> None:
        """Scalar on rank 0 at `step` (default: the current step); steps <= resumed are skipped."""
        self.scalars.log(tag, value, self.current if step is None else step)

    def close_writer(self) -> None:
        self.scalars.close()
