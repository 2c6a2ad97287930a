"""One background checkpoint write at a time: in a forked child (copy-on-write) or in a thread.

    job = background_writer.start(write, (step, state), mode="fork")   # returns at once
    job = background_writer.start(write, (step, state), "thread", writer)  # writer: a kept ThreadWriter
    seconds = job.wait()                                        # raises if the write failed

Fork mode: os.fork() gives the child a copy-on-write image of the training process, so the state
as it was at the call is what the child writes, without copying it first (the kernel copies only
the pages training changes while the child runs). A fork copies page tables, not pages, so it
costs a small fraction of a deep copy of the state, and the copy-on-write is paid only for what
training touches while the child writes. The child:
  - blocks SIGTERM, SIGUSR2, SIGUSR1 and SIGINT (inherited from the forking thread, which blocks
    them around fork): a preemption signalled to every process of the job must not end a
    checkpoint half written; the training process handles the stop and waits for this child;
  - runs no threads and no OpenMP (torch.save of CPU tensors writes their memory as it is) and
    touches no CUDA context and no process group (accelerator tensors are staged to CPU first);
  - reports through a pipe and leaves with os._exit: no atexit handlers, no flushing of the
    parent's stdio buffers, no destructors of objects it shares with the parent.
Thread mode is the fallback where fork is unavailable (or asked for): the caller must hand it a
private copy of the state, since training keeps changing the live tensors.
"""

from __future__ import annotations

import json
import os
import queue
import select
import signal
import threading
import time
import traceback
from typing import Any, Callable

MODES = ("fork", "thread")
# Signals the forked writer never acts on (see module docstring). SIGKILL cannot be blocked: a
# job killed after GraceTime loses the write in progress, and the previous checkpoint stays valid.
CHILD_BLOCKS = {signal.SIGTERM, signal.SIGUSR2, signal.SIGUSR1, signal.SIGINT}
_MESSAGE_MAX = 16_000  # bytes of traceback sent back: well below a pipe's 64 KiB buffer
# A forked writer still running after this long is taken for hung (rank 0's writer may wait up to
# 10 minutes for the other ranks' files): it is killed and the save fails loudly instead of the
# training process blocking forever at its next save. The previous checkpoint stays valid.
WRITER_TIMEOUT_S = float(os.environ.get("HPC_CHECKPOINT_WRITER_TIMEOUT_S", 1800))


def default_mode() -> str:
    return "fork" if hasattr(os, "fork") else "thread"


def start(fn: Callable[..., Any], args: tuple, mode: str,
          writer: "ThreadWriter | None" = None) -> "ForkJob | ThreadJob":
    """Run fn(*args) in the background: a forked child, or `writer`'s thread (a new ThreadWriter
    when none is given)."""
    if mode not in MODES:
        raise ValueError(f"checkpoint write mode {mode!r}; expected one of {MODES}. "
                         "HINT: mode='thread' where os.fork is unavailable.")
    if mode == "fork":
        return ForkJob(fn, args)
    return (writer or ThreadWriter()).submit(fn, args)


class ThreadJob:
    """A write run by a ThreadWriter's thread; wait() returns its seconds or raises its error."""

    def __init__(self, fn: Callable[..., Any], args: tuple) -> None:
        self._fn, self._args = fn, args
        self._error: BaseException | None = None
        self._seconds = 0.0
        self._done = threading.Event()

    def run(self) -> None:
        t0 = time.perf_counter()
        try:
            self._fn(*self._args)
        except BaseException as err:  # re-raised by wait() in the training thread
            self._error = err
        finally:
            self._fn = self._args = None  # drop the references to the state staged for this write
            self._seconds = time.perf_counter() - t0
            self._done.set()

    def wait(self) -> float:
        self._done.wait()
        if self._error is not None:
            raise self._error
        return self._seconds


class ThreadWriter:
    """A writer thread kept between saves (one per checkpoint store), fed through a queue.

    Starting a thread per save would stall the caller: Thread.start() waits until the new thread
    runs, and that thread then holds the GIL while it pickles. Handing the job to a thread
    already waiting returns at once. The thread leaves on close(), or after IDLE_S without work
    (longer than any sensible interval between saves: a store dropped without close() leaves no
    thread behind for ever), and is started again by the next job, also in a forked child, where
    the parent's thread does not exist. One thread per store, not per process: rank 0's
    write waits for the other ranks' files, and ranks simulated in one process must not queue
    behind it.
    """

    IDLE_S = 3600.0

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self._owner = os.getpid()
        self._lock = threading.Lock()
        self._jobs: queue.SimpleQueue[ThreadJob | None] = queue.SimpleQueue()  # None: leave
        self._running = False

    def submit(self, fn: Callable[..., Any], args: tuple) -> ThreadJob:
        if self._owner != os.getpid():  # a forked child: the parent's thread, lock and queue are not ours
            self._reset()
        job = ThreadJob(fn, args)
        with self._lock:  # the thread checks the queue under this lock before it leaves
            self._jobs.put(job)
            if not self._running:
                self._running = True
                threading.Thread(target=self._serve, daemon=True, name="checkpoint-writer").start()
        return job

    def close(self) -> None:
        """Let the thread leave once the jobs queued before this call are done."""
        if self._owner == os.getpid():
            self._jobs.put(None)

    def _serve(self) -> None:
        while True:
            try:
                job = self._jobs.get(timeout=self.IDLE_S)
            except queue.Empty:
                job = None
            if job is not None:
                job.run()
                # Dropped before waiting for the next job: a failed job holds its error, whose
                # traceback, once re-raised by wait(), holds the caller's frames and their locals.
                job = None
                continue
            with self._lock:
                if self._jobs.empty():
                    self._running = False
                    return


class ForkJob:
    def __init__(self, fn: Callable[..., Any], args: tuple, timeout_s: float | None = None) -> None:
        self._deadline = time.monotonic() + (WRITER_TIMEOUT_S if timeout_s is None else timeout_s)
        read, write = os.pipe()
        previous = signal.pthread_sigmask(signal.SIG_BLOCK, CHILD_BLOCKS)
        try:
            self.pid = os.fork()
            if self.pid == 0:
                _child(fn, args, read, write)  # never returns
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, previous)  # parent only: see _child
        os.close(write)
        self._read = read
        self._result: float | BaseException | None = None

    def wait(self) -> float:
        if self._result is None:
            self._result = self._reap()
        if isinstance(self._result, BaseException):
            raise self._result
        return self._result

    def _reap(self) -> float | BaseException:
        chunks, hung = [], False
        while True:
            ready, _, _ = select.select([self._read], [], [], max(0.0, self._deadline - time.monotonic()))
            if not ready:
                hung = True
                os.kill(self.pid, signal.SIGKILL)
                break
            chunk = os.read(self._read, 65536)
            if not chunk:  # EOF: the child has exited
                break
            chunks.append(chunk)
        os.close(self._read)
        try:
            _, status = os.waitpid(self.pid, 0)
        except ChildProcessError:  # SIGCHLD set to SIG_IGN somewhere: the pipe still tells
            status = None
        try:
            report = json.loads(b"".join(chunks) or b"{}")
        except ValueError:
            report = {}
        if hung:
            return RuntimeError(f"checkpoint writer process {self.pid} was still running at its deadline "
                                "and was killed. HINT: the previous complete checkpoint is still valid; "
                                "raise HPC_CHECKPOINT_WRITER_TIMEOUT_S if writes are this slow.")
        if report.get("ok"):
            return float(report["seconds"])
        if report.get("error"):
            return RuntimeError(f"checkpoint writer process {self.pid} failed:\n{report['error']}")
        how = (f"killed by signal {os.WTERMSIG(status)}" if status is not None and
               os.WIFSIGNALED(status) else f"exit status {status}")
        return RuntimeError(f"checkpoint writer process {self.pid} ended without a report ({how}). "
                            "HINT: the previous complete checkpoint is still valid; look for "
                            "an out-of-memory kill in the job's log.")


def _child(fn: Callable[..., Any], args: tuple, read: int, write: int) -> None:
    """Body of the forked writer. The signal mask set by the parent stays: never unblocked here."""
    code = 1
    try:
        os.close(read)
        t0 = time.perf_counter()
        try:
            fn(*args)
            report = {"ok": True, "seconds": time.perf_counter() - t0}
            code = 0
        except BaseException:
            report = {"ok": False, "error": traceback.format_exc()[-_MESSAGE_MAX:]}
        os.write(write, json.dumps(report).encode())
    finally:
        os._exit(code)
