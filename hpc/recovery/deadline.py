"""When a job's wrapper must take its stop decision, whatever the script it runs is doing.

    deadline = decide_by(scontrol_fields, received_at=time.time())

After a stop signal the script gets time to save and exit; but a script may ignore the signal, or
hang in its own handler (a collective with a peer that already left). The decision (requeue, or not)
must still be taken while SLURM lets the job live: before EndTime, which SLURM sets to PreemptTime +
GraceTime on a preemption and to the time limit otherwise. The wrapper decides at EndTime less a
margin for the decision itself (an scontrol call or two, then ending the script), at most half of
what is left, so that a short GraceTime still leaves the script half of it. Pure: no SLURM call here.
"""

from __future__ import annotations

import time
from typing import Mapping, Optional

DECIDE_MARGIN_S = 5.0  # scontrol show job + scontrol requeue + ending the script, with room to spare
# Without an EndTime from SLURM (scontrol failed, no SLURM): the time a script gets after the signal.
FALLBACK_WINDOW_S = 10.0


UNIX_END = "EndTimeUnix"  # EndTime as a Unix time, as the host tells it to a container (hpc.afterstep.answer_end)


def end_time(fields: Mapping[str, str]) -> Optional[float]:
    """scontrol's EndTime (local time, 2026-11-26T01:50:00) as a Unix time; None when unset or garbled.
    UNIX_END, where given, wins: a container's local time zone need not be the host's."""
    if fields.get(UNIX_END) is not None:
        return float(fields[UNIX_END])
    text = fields.get("EndTime", "")
    try:
        return time.mktime(time.strptime(text, "%Y-%m-%dT%H:%M:%S"))
    except (ValueError, OverflowError):
        return None


def decide_by(fields: Mapping[str, str], received_at: float, margin_s: float = DECIDE_MARGIN_S) -> float:
    """The Unix time by which to decide after a stop signal received at `received_at`."""
    end = end_time(fields)
    if end is None or end <= received_at:
        return received_at + FALLBACK_WINDOW_S / 2
    left = end - received_at
    return end - min(margin_s, left / 2)
