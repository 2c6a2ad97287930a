"""The host of a packed job's items: their stop requests settled as one, the job requeued once.

    host = Host(run_dir, job_id, restart); path = host.add(n); ... host.look(running=[...])

Each item's step gets a request file of its own (hpc.recovery.hostact: <run>/.host/<job>-<restart>.pack<n>/),
where its rank 0 writes its stop (a preemption, the time limit, a hang, submitit's checkpoint) after
checkpointing, and waits for the answer. At a stop every item asks within its own step; the job is
requeued once the items still running have all asked (or SETTLE_WAIT_S after the first asked: an item
without hpc's loop never asks): the first request is carried out as an unpacked job's host does
(hpc.recovery.nodeaction.settle_request: SLURM read, the requeue, its history), and every other one is
answered with that outcome, recorded in its own item's history. A request that comes later gets the
same answer. A question for the job's EndTime (a `run` item's deadline) is answered from SLURM.

An item without hpc's loop never asks: at the preemption's SIGTERM it ends. Where every step has
ended with items unfinished, nothing was settled and SLURM shows this attempt preempted (preempted:
one scontrol call), the driver writes for each unfinished item the request its loop would have written
(stand_in), which is settled as above. SLURM does not requeue a preempted job that ends within its
GraceTime (Slurm 22.05): without it the job would end FAILED, where the srun wrapper of an unpacked
job requeues it (hpc.recovery.nodeaction.after_step).
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Dict, Optional, Sequence

from hpc.recovery import hostact

HISTORY = ("checkpoints", "requeue.json")  # in an item's task directory: its stop record, as its loop keeps it

HOST_ACTS = hostact.ENV
SETTLE_WAIT_S = 20.0  # the longest the first request waits for its siblings' before the job is requeued


class Host:
    def __init__(self, run_dir: str, job_id: str, restart: str):
        self.run_dir, self.job_id, self.restart = run_dir, job_id, restart
        self.paths: Dict[int, str] = {}
        self.pending: Dict[int, Dict[str, Any]] = {}  # item position -> its request, not answered yet
        self.answered: set = set()
        self.outcome: Optional[Dict[str, Any]] = None  # what the first request's settling did
        self.first_at: Optional[float] = None
        self.said = ""
        self.stood_in = False  # whether requests were written for items that did not ask

    def add(self, n: int, in_place: int = 0) -> str:
        """The request file of item n's step (`in_place`: its restart in place), its folder made (the ranks write there)."""
        path = hostact.request_path(self.run_dir, self.job_id, f"{self.restart}.pack{n}" + f".{in_place}" * bool(in_place))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        self.paths[n] = path
        return path

    def asked(self, n: int) -> bool:
        return n in self.pending or n in self.answered

    def waiting(self) -> bool:
        return bool(self.pending)

    def look(self, running: Sequence[int]) -> None:
        """One listing of each item's folder: new requests read, EndTime questions answered, and the
        requests settled once every running item asked (or the first waited SETTLE_WAIT_S)."""
        from hpc.fs import sharedfs  # here, not at the top: as the rest, loaded once a job runs

        for n, path in self.paths.items():
            names = sharedfs.listed(os.path.dirname(path))
            if hostact.END_ASK in names:
                self._answer_end(path)
            if n not in self.answered and n not in self.pending and os.path.basename(path) in names:
                request = hostact.pending(path)
                if request is not None:
                    self.pending[n] = request
                    self.first_at = self.first_at or time.monotonic()
        if not self.pending:
            return
        everyone = all(n in self.pending or n in self.answered for n in running)
        if self.outcome is None and (everyone or time.monotonic() - self.first_at >= SETTLE_WAIT_S):
            self._settle_first()
        if self.outcome is not None:
            for n in sorted(self.pending):
                self._answer(n)

    def preempted(self) -> bool:
        """Whether SLURM shows this attempt of the job preempted and not yet queued again."""
        from hpc.recovery import nodefail, preemption  # only once the steps have ended, items unfinished

        info = preemption.job_info(self.job_id, tries=1)
        return nodefail.preempted(info) and not nodefail.requeued(info, int(self.restart or 0))

    def stand_in(self, n: int, task_dir: str) -> None:
        """Item n's preemption request written for it, as its loop would have (its step has ended)."""
        from hpc.config import defaults  # only at a stop

        self.stood_in = True
        hostact.ask(self.paths[n], {"reason": "preempt", "history": os.path.join(task_dir, *HISTORY),
                                    "job_id": self.job_id, "restart": int(self.restart or 0),
                                    "max_timeouts": defaults.MAX_TIMEOUTS})

    def _settle_first(self) -> None:
        from hpc.recovery import nodeaction  # only at a stop

        n = min(self.pending)
        path = self.paths[n]
        if str(self.pending[n].get("job_id")) != self.job_id:  # a rank names its job by SLURM_JOB_ID: see packrun
            hostact.ask(path, {**self.pending[n], "job_id": self.job_id})
        try:
            line = nodeaction.settle_request(path)
        except Exception as err:  # settle_request answered the rank with the error
            line = f"not carried out: {type(err).__name__}: {err}"
        done = json.loads(Path(path + ".done").read_text()) if os.path.exists(path + ".done") else {}
        self.outcome = dict(done.get("outcome") or {"requeue": False, "why": line})
        self.said = f"the items stopped: {line}"
        print(f"[hpc] item {n}'s stop settled for the packed job: {line}", file=sys.stderr, flush=True)
        self.pending.pop(n)
        self.answered.add(n)

    def _answer(self, n: int) -> None:
        """Item n answered with the first's outcome, recorded in its own history: one requeue for all."""
        # only at a stop
        from hpc.recovery import preemption
        from hpc.recovery.verdict import Decision

        request, outcome = self.pending.pop(n), dict(self.outcome or {})
        if request.get("history") and "error" not in outcome:
            decision = Decision(bool(outcome.get("requeue")), outcome.get("by"), str(outcome.get("why", "")),
                                str(outcome.get("kind") or request.get("reason")))
            history = Path(request["history"])
            preemption.record(history, preemption.load_history(history), decision, {},
                              slurm="with the packed job's one requeue" if decision.requeue else "")
        hostact.done(self.paths[n], outcome)
        self.answered.add(n)

    def _answer_end(self, path: str) -> None:
        try:
            from hpc.recovery import preemption  # only when a rank asks

            hostact.answer_end(path, lambda: preemption.job_info(self.job_id, tries=1))
        except Exception as err:  # the rank keeps its fallback deadline
            print(f"[hpc] the job's EndTime not told to the ranks: {type(err).__name__}: {err}", file=sys.stderr,
                  flush=True)
