"""A time-limit signal that may reach no task: due within half a minute of the job's start.

    note = earlysignal.note("stages.train", {"time_min": 1, "signal_delay_s": 40, ...})   # hpc.pipeline.plan

SLURM looks at its jobs about every 30 s and sends `--signal=SIG@N` at its first look once the limit
is within N + 30 s, and only to the job's steps. With a limit below N + 60 s that look can come
before the tasks have started (a container, a slow interpreter start), and the job then runs into
its limit unwarned. Pure: the plan prints the note, nothing is refused.
"""
from __future__ import annotations

from typing import Any, Mapping, Optional

LEAD_S = 60  # the time limit must exceed signal_delay_s by this much for the signal to come after the start


def note(key: str, res: Mapping[str, Any]) -> Optional[str]:
    """The plan's note for the resources section `key` (stages.X) when its signal is due that early."""
    if res["time_min"] * 60 >= res["signal_delay_s"] + LEAD_S:
        return None
    return (f"{key}: its time-limit signal is due within half a minute of the job's start ({key}.signal_delay_s="
            f"{res['signal_delay_s']}, time_min={res['time_min']}): SLURM sends it at its first look at the job, "
            "about every 30 s, to the tasks that have started by then, so the tasks may never hear of the limit. "
            f"HINT: {key}.time_min={-(-(res['signal_delay_s'] + LEAD_S) // 60)} or more, or a smaller "
            "signal_delay_s")
