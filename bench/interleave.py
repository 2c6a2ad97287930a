"""Paired A/B step times: two variants trained in the same processes, in alternating blocks of
steps, and a bootstrap confidence interval on the ratio of their step times.

    times = run_blocks(Arm("torch", step_a), Arm("hpc", step_b, block_end=wait), blocks=8, size=40)
    est = paired_ratio([times_launch1, times_launch2], stat="median")   # est.ratio, est.lo, est.hi

On a shared machine the load changes from second to second and from launch to launch, and that
spread is larger than the 2% being asked about. Running both variants in one pair of processes,
block after block (A B B A A B ...), lets every change of load hit both alike; each block pair
gives one paired ratio. The interval comes from a two-level bootstrap: launches resampled, then
the block pairs within each, so both the spread between blocks and the one between launches
(where each process's memory layout, threads and port differ) widen it.
"""
from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass
from statistics import mean, median
from typing import Any, Callable, Dict, List, Optional, Sequence

BOOTSTRAP = 4000  # resamples; the interval's ends move by well under 0.1% between seeds at this count


@dataclass
class Arm:
    """One variant: `step()` trains one step; `block_end()`, timed as part of the block's last
    step, waits for work the variant left running (a background checkpoint write)."""

    name: str
    step: Callable[[], None]
    block_end: Optional[Callable[[], None]] = None


def _block(arm: Arm, size: int, cpu: Optional[Dict[str, List[List[float]]]] = None) -> List[float]:
    """The block's step times; `cpu` gets [process CPU, this thread's CPU] of the block under the
    arm's name (what its other threads, a checkpoint writer or the collectives', used is the difference)."""
    tops = []
    process, thread = time.process_time(), time.thread_time()
    for _ in range(size):
        tops.append(time.perf_counter())
        arm.step()
    if arm.block_end is not None:
        arm.block_end()
    tops.append(time.perf_counter())
    if cpu is not None:
        cpu.setdefault(arm.name, []).append([time.process_time() - process, time.thread_time() - thread])
    return [b - a for a, b in zip(tops, tops[1:])]


def built_in_order(build_a: Callable[[], Arm], build_b: Callable[[], Arm], b_first: bool) -> tuple:
    """(A, B), the one that runs first built first: neither arm's memory (its model, its buffers)
    is always laid out second."""
    if b_first:
        b = build_b()
        return build_a(), b
    a = build_a()
    return a, build_b()


def run_blocks(a: Arm, b: Arm, blocks: int, size: int, b_first: bool = False,
               only: str = "") -> Dict[str, List[List[float]]]:
    """Step times per block of each arm: a warm-up block each (dropped), then `blocks` pairs in
    the order A B, B A, A B, ... (B A first when b_first), so neither arm always runs second.
    `only` names one arm to train alone (a profile of it). Under "cpu": each arm's CPU per block."""
    if only:
        arm = a if a.name == only else b
        return {arm.name: [_block(arm, size) for _ in range(blocks + 1)][1:]}
    first, second = (b, a) if b_first else (a, b)
    _block(first, size), _block(second, size)
    out: Dict[str, Any] = {a.name: [], b.name: []}
    cpu: Dict[str, List[List[float]]] = {}
    for i in range(blocks):
        order = (first, second) if i % 2 == 0 else (second, first)
        for arm in order:
            out[arm.name].append(_block(arm, size, cpu))
    out["cpu"] = cpu
    return out


@dataclass
class Estimate:
    ratio: float  # B's step time over A's: the statistic over all block pairs
    lo: float  # 95% bootstrap interval
    hi: float
    pairs: int
    launches: int
    p90_ratio: float  # pooled p90 of B's steps over pooled p90 of A's

    def verdict(self, target: float) -> str:
        if self.hi <= target:
            return "the whole interval is at or below the target"
        if self.lo > target:
            return "the whole interval is above the target"
        return ("the interval includes the target: not resolved at this load"
                f"{self._launches_to_resolve(target)}")

    def _launches_to_resolve(self, target: float) -> str:
        """How many launches would tell this ratio from the target, if it held: the interval
        narrows with the square root of the launches (the bootstrap resamples launches)."""
        half, gap = (self.hi - self.lo) / 2, abs(target - self.ratio)
        if gap < 1e-4 or not self.launches:
            return ""
        need = math.ceil(self.launches * (half / gap) ** 2)
        return f" (were the ratio to hold, about {need} launches instead of {self.launches} would tell it from {target}x)"

    def text(self) -> str:
        return f"{self.ratio:.3f}x (95% interval {self.lo:.3f}x to {self.hi:.3f}x)"


def p90(xs: Sequence[float]) -> float:
    return sorted(xs)[int(0.9 * (len(xs) - 1))]


def paired_ratio(launches: Sequence[Dict[str, List[List[float]]]], a: str, b: str, stat: str = "median",
                 seed: int = 0) -> Estimate:
    """Ratio of B's block statistic to A's (median or mean step per block), summed over the block
    pairs of every launch, with a two-level bootstrap interval (launches, then pairs)."""
    f = median if stat == "median" else mean
    per_launch = [[(f(x), f(y)) for x, y in zip(run[a], run[b])] for run in launches]

    def ratio(groups: Sequence[Sequence[tuple]]) -> float:
        return sum(y for g in groups for _, y in g) / sum(x for g in groups for x, _ in g)

    rng = random.Random(seed)
    draws = []
    for _ in range(BOOTSTRAP):
        picked = [per_launch[rng.randrange(len(per_launch))] for _ in per_launch]
        draws.append(ratio([[g[rng.randrange(len(g))] for _ in g] for g in picked]))
    draws.sort()
    return Estimate(ratio(per_launch), draws[int(0.025 * len(draws))], draws[int(0.975 * len(draws)) - 1],
                    sum(len(g) for g in per_launch), len(per_launch),
                    p90(pooled(launches, b)) / p90(pooled(launches, a)))


def pooled(launches: Sequence[Dict[str, List[List[float]]]], name: str) -> List[float]:
    return [t for run in launches for blk in run[name] for t in blk]
