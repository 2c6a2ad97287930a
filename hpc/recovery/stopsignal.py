"""Stop signals as a flag, and the stop step all ranks agree on without a per-step device sync.

    python -c "import os, signal; from hpc.recovery.stopsignal import StopFlag; f = StopFlag().install(); \
os.kill(os.getpid(), signal.SIGUSR2); print(f.local())"

SLURM announces the end of a job with a signal to every process of the step: the pre-timeout
signal (``--signal=USR2@N``; USR2, not USR1, because NCCL may catch USR1) or, on preemption,
SIGTERM followed by GraceTime. The handlers here only record it; training stops at a step
boundary that every rank agrees on (StopVote), and hpc.recovery.preemption decides about the requeue.
Importing this module does not import torch.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from typing import Any, Callable

# Which signal means what. The pre-timeout signal is configurable (HPC_TIMEOUT_SIGNAL or install()).
DEFAULT_TIMEOUT_SIGNAL = os.environ.get("HPC_TIMEOUT_SIGNAL", "USR2")
PREEMPT_SIGNAL = "TERM"
# Stop reasons as all-reduce codes: MAX across ranks, so a preemption seen anywhere wins.
REASON_CODES = {None: 0, "timeout": 1, "preempt": 2}
CODE_REASONS = {v: k for k, v in REASON_CODES.items()}
# Set in every step of a `--cluster here` run (hpc.here): a stop there is the user's Ctrl-C,
# never requeued (hpc.recovery.preemption.handle_stop); the same command resumes from the checkpoint.
INTERACTIVE_ENV = "HPC_INTERACTIVE_STEP"


@dataclass(frozen=True)
class StopRequest:
    """Why this process should stop at the current step: 'timeout' or 'preempt'."""

    reason: str
    signal: str | None = None  # the signal this rank saw itself, None if only another rank did

    def __bool__(self) -> bool:
        return True


class StopFlag:
    """Signal handlers that record the first stop signal and do nothing else.

    A context manager: entering installs the handlers (main thread only), leaving puts back the
    handlers that were there before. ``install()``/``uninstall()`` do the same by hand.
    """

    def __init__(self, timeout_signal: str = DEFAULT_TIMEOUT_SIGNAL) -> None:
        self.kinds = {signal_number(timeout_signal): "timeout", signal_number(PREEMPT_SIGNAL): "preempt"}
        if len(self.kinds) != 2:
            raise ValueError(f"timeout signal {timeout_signal} is the preemption signal TERM. "
                             "HINT: use USR2 (the default) or another USR signal.")
        self.reason: str | None = None
        self.signal: str | None = None
        self.received_at: float | None = None
        self._previous: dict[int, Any] = {}

    def install(self) -> "StopFlag":
        # Replaces submitit's handlers, which would requeue from inside the handler on rank 0
        # only, guessing timeout vs preemption from elapsed time.
        for signum in self.kinds:
            previous = signal.signal(signum, self._handle)
            self._previous.setdefault(signum, previous)  # installing twice keeps the first
        return self

    def uninstall(self) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous.clear()

    __enter__ = install

    def __exit__(self, *exc: Any) -> None:
        self.uninstall()

    def _handle(self, signum: int, frame: Any) -> None:
        kind = self.kinds[signum]
        # A preemption outranks a timeout (it always requeues); otherwise keep the first signal.
        # A reason set here (the run wrapper's "hang") is a decision already taken: no signal outranks it.
        if self.reason is None or REASON_CODES[kind] > REASON_CODES.get(self.reason, len(REASON_CODES)):
            self.reason, self.signal = kind, signal.Signals(signum).name
            self.received_at = time.time()

    def local(self) -> StopRequest | None:
        return StopRequest(self.reason, self.signal) if self.reason else None


def install(timeout_signal: str = DEFAULT_TIMEOUT_SIGNAL) -> StopFlag:
    """A new StopFlag with its handlers installed; ``uninstall()`` (or a ``with``) removes them."""
    return StopFlag(timeout_signal).install()


def signal_number(name: str = DEFAULT_TIMEOUT_SIGNAL) -> int:
    """The number of a signal named like USR2 or SIGUSR2; a one-line error with a HINT otherwise."""
    sig = getattr(signal, "SIG" + name.upper().removeprefix("SIG"), None)
    if sig is None:
        raise ValueError(f"unknown signal {name!r}; expected a name such as USR2 or TERM. "
                         "HINT: set HPC_TIMEOUT_SIGNAL=USR2.")
    return int(sig)


class StopVote:
    """The stop request all ranks agree on, without waiting for the device at each poll.

    poll() launches an asynchronous MAX all-reduce of this rank's flag and returns the result of
    the one launched at the previous poll, which has long finished: every rank reads the same
    vote at the same poll, so all stop at the same step, one poll after the first signal. On CUDA
    the result is copied to pinned memory behind an event, so reading it waits for the previous
    step's work only, never for the step just queued (``.item()`` would drain the stream).
    Without a process group the local flag answers at once. close() waits for the last vote.

    poll(pace=N) also carries one number per rank through the same all-reduce: `agreed_pace` is
    then the largest over the ranks, from the previous poll, the same on every rank. TrainLoop
    sends its time per step, so that every rank derives the same next poll step from it.
    """

    def __init__(self, flag: StopFlag, device: Any = "cpu") -> None:
        self.flag, self.device = flag, device
        self._pending: tuple[Callable[[], Any], Any] | None = None
        self._buf = self._host = self._event = None
        self.agreed_pace = 0

    @staticmethod
    def distributed() -> bool:
        import torch.distributed as dist

        return dist.is_available() and dist.is_initialized()

    def poll(self, pace: int = 0) -> StopRequest | None:
        """Call at the same step boundaries on every rank (a collective when distributed)."""
        if not self.distributed():
            self.agreed_pace = pace
            return self.flag.local()
        code = self._collect()
        self._launch(pace)
        reason = CODE_REASONS[code]
        if reason is None:
            return None
        mine = self.flag.local()
        return StopRequest(reason, mine.signal if mine else None)

    def _launch(self, pace: int) -> None:
        import torch
        import torch.distributed as dist

        if self._buf is None:
            self._buf = torch.zeros(2, dtype=torch.int32, device=self.device)
        mine = self.flag.local()
        self._buf[0].fill_(REASON_CODES[mine.reason if mine else None])  # kernels: no host copy
        self._buf[1].fill_(max(0, min(int(pace), 2**31 - 1)))
        work = dist.all_reduce(self._buf, op=dist.ReduceOp.MAX, async_op=True)
        if self._buf.is_cuda:
            if self._host is None:
                self._host = torch.zeros(2, dtype=torch.int32, pin_memory=True)
                self._event = torch.cuda.Event()
            # On the vote buffer's device, which need not be the current one in a process that
            # drives several GPUs: the wait, the copy and the event must all be on its stream.
            with torch.cuda.device(self._buf.device):
                work.wait()  # orders the device's current stream after the all-reduce; the host goes on
                self._host.copy_(self._buf, non_blocking=True)
                self._event.record(torch.cuda.current_stream(self._buf.device))
            self._pending = (self._event.synchronize, self._host)
        else:
            self._pending = (work.wait, self._buf)

    def _collect(self) -> int:
        if self._pending is None:
            return 0
        (wait, result), self._pending = self._pending, None
        wait()
        code, self.agreed_pace = result.tolist()
        return code

    def close(self) -> None:
        """Wait for the vote still in flight (every rank launched it, so it completes)."""
        self._collect()

    def abandon(self) -> None:
        """Forget the vote in flight without waiting: after an error, peers may never join it."""
        self._pending = None


VOTE_PERIOD_S = 0.1  # stop checks about this far apart: latency to stop, against a collective per step
MAX_CHECK_EVERY = 10_000


def check_interval(pace_us: int, period_s: float = VOTE_PERIOD_S) -> int:
    """Steps between stop checks for a time per step of `pace_us` (0: unknown, check at once)."""
    if pace_us <= 0:
        return 1
    return max(1, min(MAX_CHECK_EVERY, int(period_s * 1e6 / pace_us)))


class CheckSchedule:
    """The steps at which a loop polls its StopVote: every `every` steps, or (every=None) about every
    VOTE_PERIOD_S of training, whatever the step time. The vote carries each rank's time per step
    and every rank derives the next check's step from the slowest, so all poll at the same steps."""

    def __init__(self, vote: StopVote, every: int | None = None) -> None:
        self.vote, self.every = vote, every
        self._next: int | None = None  # step of the next check (every=None)
        self._last: tuple[float, int] | None = None  # (time, step) of this rank's last check

    def due(self, step: int) -> bool:
        if self.every is not None:
            return step % self.every == 0
        return self._next is None or step >= self._next

    def poll(self, step: int) -> StopRequest | None:
        """The vote at `step` (a collective when distributed), and the next check scheduled."""
        request = self.vote.poll(pace=self._pace(step))
        self._next = step + self._interval()
        return request

    def _pace(self, step: int) -> int:
        """This rank's microseconds per step since its last check (0 at the first)."""
        now, (then, before) = time.perf_counter(), self._last or (0.0, step)
        self._last = (now, step)
        return int((now - then) * 1e6 / (step - before)) if step > before else 0

    def _interval(self) -> int:
        """Steps to the next check: the same on every rank, from the vote's agreed (slowest) pace.
        One process checks every step: its vote is a local read, no collective."""
        if self.every is not None:
            return self.every
        return check_interval(self.vote.agreed_pace) if self.vote.distributed() else 1
