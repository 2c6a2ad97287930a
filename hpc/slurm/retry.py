"""Which SLURM client failures are worth another try, and how long to keep trying.

    python -c "from hpc.slurm import retry; print(retry.classify('squeue: error: slurm_load_jobs error: Socket timed out on send/recv operation'))"

A busy or restarting controller makes the clients fail for a moment (`Socket timed out on send/recv
operation`, `Unable to contact slurm controller`, slurmdbd unreachable for sacct): those are
TRANSIENT, and hpc.slurm.cli.run asks again with exponential backoff and jitter under a total
deadline. A refusal (an unknown partition, account or QOS, an invalid option, a submit limit, an
unknown job id) is DEFINITE: asking again would get the same answer, so it is never retried. Words
in neither table are definite too: hpc retries only what it knows to be passing.

The deadline: `deadline_s` of the call when its caller must stay bounded (the srun wrapper at a
preemption has only the grace time), else HPC_SLURM_RETRY_S from the environment (default 60 s).
"""
from __future__ import annotations

import os
import random
from typing import Tuple

TRANSIENT, DEFINITE = "transient", "definite"
DEADLINE_ENV = "HPC_SLURM_RETRY_S"
DEFAULT_DEADLINE_S = 60.0
FIRST_WAIT_S, MAX_WAIT_S = 1.0, 15.0

# Fragments of SLURM's words (case-insensitive): a refusal first, as a refusal may quote a transient
# error's words ("... Connection refused" from a job submit plugin is still a refusal).
DEFINITE_WORDS: Tuple[str, ...] = (
    "invalid partition", "invalid account", "invalid qos", "invalid job id", "invalid user",
    "invalid option", "unrecognized option", "unknown option", "invalid argument", "invalid node name",
    "invalid generic resource", "invalid job array", "invalid feature", "invalid wckey",
    "maxsubmitjob", "job violates accounting/qos policy", "qosmax", "assocmax", "assocgrp", "qosgrp",
    "access/permission denied", "access denied", "requested node configuration is not available",
    "node count specification invalid", "requested time limit is invalid", "job has already finished",
    "accounting storage is disabled", "requested operation is presently disabled",
    "only one job may be specified", "duplicate job id", "no partition specified",
)
TRANSIENT_WORDS: Tuple[str, ...] = (
    "socket timed out", "resource temporarily unavailable", "unable to contact slurm controller",
    "transport endpoint is not connected", "zero bytes were transmitted or received", "connection refused",
    "connection reset", "connection timed out", "communication connection failure",
    "slurm_persist_conn_open", "problem talking to the database", "unable to connect to database",
    "slurmdbd", "backup controller in standby mode", "temporarily unable to accept job",
    "network is unreachable", "no route to host", "send/receive error", "slurm_load_jobs error: unexpected message",
    "gave no answer within",  # hpc's words for a client that outlived its timeout (hpc.slurm.cli)
)

# Failures after which a submission may have been queued all the same (the answer was lost, not the
# request): sbatch is asked again only once its caller has looked for the job (cli.run's `lookup`).
MAY_HAVE_ACTED: Tuple[str, ...] = ("socket timed out", "zero bytes were transmitted", "connection reset",
                                   "transport endpoint is not connected", "send/receive error",
                                   "gave no answer within")


def classify(words: str) -> str:
    """TRANSIENT when SLURM's `words` say the controller or database could not answer now, else DEFINITE."""
    low = words.lower()
    if any(w in low for w in DEFINITE_WORDS):
        return DEFINITE
    return TRANSIENT if any(w in low for w in TRANSIENT_WORDS) else DEFINITE


def may_have_acted(words: str) -> bool:
    """Whether the request may have reached slurmctld although the client reports a failure."""
    low = words.lower()
    return any(w in low for w in MAY_HAVE_ACTED)


def deadline_s() -> float:
    """HPC_SLURM_RETRY_S (seconds, 0: never retry), else DEFAULT_DEADLINE_S."""
    raw = os.environ.get(DEADLINE_ENV, "")
    try:
        return max(0.0, float(raw)) if raw.strip() else DEFAULT_DEADLINE_S
    except ValueError:  # a RuntimeError, as the clients' failures: every command says it in one line
        raise RuntimeError(f"{DEADLINE_ENV}={raw!r}: expected seconds (a number). "
                           f"HINT: export {DEADLINE_ENV}=60, or unset it") from None


def wait_s(attempt: int, rng: random.Random = random._inst) -> float:  # type: ignore[attr-defined]
    """The pause after failed attempt `attempt` (1-based): doubling from FIRST_WAIT_S up to MAX_WAIT_S,
    with jitter of -50 % to +50 % so that many clients do not come back at the same moment."""
    return min(MAX_WAIT_S, FIRST_WAIT_S * 2 ** (attempt - 1)) * rng.uniform(0.5, 1.5)


def retry_line(client: str, words: str, pause: float, attempt: int, left: float) -> str:
    """The one line logged per retry, SLURM's words first (without the client's own "squeue: error: ")."""
    prefix = f"{client}: error: "
    words = words[len(prefix):] if words.startswith(prefix) else words
    return f"[hpc] {client}: {words}; retrying in {pause:.1f} s (attempt {attempt + 1}, {left:.0f} s left)"
