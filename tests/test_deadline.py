"""The stop decision's deadline from SLURM's EndTime (hpc.recovery.deadline)."""

import time

from hypothesis import given
from hypothesis import strategies as st

from hpc.recovery.deadline import DECIDE_MARGIN_S, FALLBACK_WINDOW_S, decide_by, end_time


def stamp(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(t))


def test_a_preemption_with_a_long_grace_time_decides_a_margin_before_its_end():
    now = 1_800_000_000.0
    assert decide_by({"EndTime": stamp(now + 120)}, now) == now + 120 - DECIDE_MARGIN_S


def test_a_short_grace_time_leaves_the_script_half_of_it():
    now = 1_800_000_000.0
    assert decide_by({"EndTime": stamp(now + 6)}, now) == now + 3


def test_no_end_time_or_one_already_past_falls_back_to_a_short_window():
    now = 1_800_000_000.0
    for fields in ({}, {"EndTime": "Unknown"}, {"EndTime": "garbage\n"}, {"EndTime": stamp(now - 30)}):
        assert decide_by(fields, now) == now + FALLBACK_WINDOW_S / 2


@given(st.text(max_size=40), st.floats(0, 4e9))
def test_any_end_time_text_gives_a_deadline_after_the_signal(text, now):
    assert end_time({"EndTime": text}) is None or isinstance(end_time({"EndTime": text}), float)
    assert decide_by({"EndTime": text}, now) > now
