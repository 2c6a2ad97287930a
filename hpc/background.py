"""One background checkpoint write at a time: in a forked child (copy-on-write) or in a thread.

    job = background.start(write, (step, state), mode="fork")   # returns at once
    seconds = job.wait()                                        # raises if the write failed

Fork mode: os.fork() gives the child a copy-on-write image of the training process, so the state
as it was at the call is what the child writes, without copying it first (the kernel copies only
the pages training changes while the child runs). Forking a process of 1 GB costs ~15-20 ms
(page tables) against ~0.5 s for a fresh deep copy. The child:
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
_queue_lock = threading.Lock()


def default_mode() -> str:
    return "fork" if hasattr(os, "fork") else "thread"


def start(fn: Callable[..., Any], args: tuple, mode: str) -> "ForkJob | ThreadJob":
    if mode not in MODES:
        raise ValueError(f"checkpoint write mode {mode!r}; expected one of {MODES}. "
                         "HINT: mode='thread' where os.fork is unavailable.")
    return (ForkJob if mode == "fork" else ThreadJob)(fn, args)


class ThreadJob:
    """A write run by the process's one writer thread (started on first use, kept for later saves).

    Starting a thread per save would cost the caller ~1-2 ms: Thread.start() waits until the new
    thread runs, and that thread then holds the GIL while it pickles. Handing the job to a thread
    already waiting on a queue returns at once.
    """

    def __init__(self, fn: Callable[..., Any], args: tuple) -> None:
        self._fn, self._args = fn, args
        self._error: BaseException | None = None
        self._seconds = 0.0
        self._done = threading.Event()
        _writer_queue().put(self)

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


_queue: "queue.SimpleQueue[ThreadJob] | None" = None
_queue_pid = 0


def _writer_queue() -> "queue.SimpleQueue[ThreadJob]":
    """The writer thread's queue; a new thread in a forked child (threads do not survive fork)."""
    global _queue, _queue_pid
    with _queue_lock:
        if _queue is None or _queue_pid != os.getpid():
            _queue, _queue_pid = queue.SimpleQueue(), os.getpid()
            threading.Thread(target=_serve, args=(_queue,), daemon=True, name="checkpoint-writer").start()
        return _queue


def _serve(jobs: "queue.SimpleQueue[ThreadJob]") -> None:
    while True:
        jobs.get().run()


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
