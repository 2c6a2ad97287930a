"""Paired A/B benchmark statistics (bench.interleave): block order and the ratio's interval.

    python -m pytest tests/test_interleave.py
"""
from __future__ import annotations

import random

from bench.interleave import Arm, paired_ratio, run_blocks


def test_blocks_alternate_which_arm_runs_first():
    calls = []
    a, b = Arm("a", lambda: calls.append("a")), Arm("b", lambda: calls.append("b"))
    times = run_blocks(a, b, blocks=3, size=1)
    assert calls == ["a", "b", "a", "b", "b", "a", "a", "b"]  # warm-up pair, then A B, B A, A B
    assert len(times["a"]) == len(times["b"]) == 3  # the warm-up blocks are dropped
    calls.clear()
    run_blocks(a, b, blocks=2, size=1, b_first=True)
    assert calls == ["b", "a", "b", "a", "a", "b"]


def test_block_end_is_timed_inside_the_block():
    ended = []
    b = Arm("b", lambda: None, block_end=lambda: ended.append(1))
    times = run_blocks(Arm("a", lambda: None), b, blocks=2, size=4)
    assert len(ended) == 3 and all(len(blk) == 4 for blk in times["b"])


def _launches(scale, noise, n_launches=4, blocks=8, seed=1):
    rng = random.Random(seed)
    out = []
    for _ in range(n_launches):
        run = {"a": [], "b": []}
        for _ in range(blocks):
            load = rng.uniform(0.5, 2.0)  # the machine's load moves both arms of a pair alike
            run["a"].append([load * (1 + rng.gauss(0, noise)) for _ in range(5)])
            run["b"].append([load * scale * (1 + rng.gauss(0, noise)) for _ in range(5)])
        out.append(run)
    return out


def test_an_exact_ratio_has_no_width():
    est = paired_ratio(_launches(1.1, 0.0), "a", "b")
    assert abs(est.ratio - 1.1) < 1e-9 and abs(est.lo - 1.1) < 1e-9 and abs(est.hi - 1.1) < 1e-9
    assert est.pairs == 32 and est.launches == 4
    assert est.verdict(1.02).startswith("the whole interval is above")


def test_noise_widens_the_interval_around_the_ratio():
    est = paired_ratio(_launches(1.0, 0.05), "a", "b", stat="mean")
    assert est.lo < est.ratio < est.hi and est.lo < 1.0 < est.hi
    assert "not resolved at this load" in est.verdict(1.0)  # then how many launches would resolve it
    assert paired_ratio(_launches(0.8, 0.01), "a", "b").verdict(1.02).startswith("the whole interval is at or below")
