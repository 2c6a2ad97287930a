"""The progress watchdog and the hang record, without SLURM: one process plays every rank with a
clock the test moves, and real gloo jobs on this machine stop a rank or outlive a timeout.

    python -m pytest tests/test_watchdog.py -q

The same hang runs as a 2 x 2 job on the local cluster in tests/slurm/test_hang.py.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpc.recovery import hangs, verdict, watchdog
from tests.hang_workload import launch


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def ranks(directory: Path, world: int, clock: Clock, decisions: list, exits: dict, **kw) -> list:
    """One Watchdog per rank, as each rank's process would make it (not started: the test drives it)."""
    def decide(report: dict) -> dict:
        decisions.append(report)
        return {"requeue": True, "why": "requeued by the test"}

    dogs = []
    for r in range(world):
        dog = watchdog.Watchdog(directory, r, world, f"node{r // 2 + 1}", 5.0, decide, clock=clock,
                                exit=lambda code, r=r: exits.setdefault(r, code), **kw)
        dog.hang.introduce(dog.host)
        dogs.append(dog)
    return dogs


def test_a_silent_rank_is_named_with_its_host_and_every_other_rank_saves_its_stacks(tmp_path):
    clock, decisions, exits = Clock(), [], {}
    attempt = hangs.attempt_dir(tmp_path, "12", 0)
    dogs = ranks(attempt, 4, clock, decisions, exits)
    for dog in dogs:
        dog.beat(7)
    clock.now += 4.0
    assert [dog.check() for dog in dogs[:3]] == ["watching"] * 3
    clock.now += 1.5  # rank 3 is stopped: it never looks again
    assert [dog.check() for dog in dogs[:3]] == ["fired"] * 3
    assert sorted(dogs[0].hang.answers()) == [0, 1, 2]
    assert dogs[0].check() == "gathering" and not decisions  # rank 3 may still answer
    clock.now += dogs[0].gather_s + 0.1
    assert dogs[0].check() == "ended" and len(decisions) == 1
    assert [dog.check() for dog in dogs[1:3]] == ["ended", "ended"]
    assert exits == {0: 0, 1: 0, 2: 0}  # requeued: nothing failed
    report = dogs[1].hang.report()
    assert report["stuck"] == [3] and report["hosts"] == {"3": "node2"} and report["answered"] == [0, 1, 2]
    assert report["decision"]["requeue"] and report["last_step"] == 7
    stacks = (attempt / "rank-1.txt").read_text().splitlines()
    assert json.loads(stacks[0])["step"] == 7 and any("File " in line for line in stacks[1:])
    assert "rank 3 on node2 did not answer" in hangs.summary(tmp_path)


def test_a_rank_still_stepping_is_not_asked_until_idle_for_half_its_limit(tmp_path):
    clock, decisions, exits = Clock(), [], {}
    first, second = ranks(tmp_path, 2, clock, decisions, exits)
    first.beat(3)
    clock.now += 4.0
    second.beat(4)
    clock.now += 1.5
    assert first.check() == "fired"
    assert second.check() == "watching" and "rank-1.txt" not in first.hang.names()
    clock.now += 1.5
    assert second.check() == "asked" and "rank-1.txt" in first.hang.names()
    clock.now += first.gather_s
    assert first.check() == "ended"
    report = first.hang.report()
    assert report["stuck"] == [0] and "behind" in report["why"]  # step 3 against 4


def test_verdict_when_every_rank_answered():
    answers = {r: {"step": 9, "host": f"h{r}"} for r in range(4)}
    assert hangs.verdict(4, answers, {})["stuck"] == []
    answers[2]["step"] = 8
    found = hangs.verdict(4, answers, {})
    assert found["stuck"] == [2] and found["hosts"] == {"2": "h2"}
    answers[1]["step"] = None  # no step completed yet: behind too
    assert hangs.verdict(4, answers, {})["stuck"] == [1, 2]
    silent = hangs.verdict(4, {0: answers[0]}, {3: {"host": "h3"}})
    assert silent["stuck"] == [1, 2, 3] and silent["hosts"]["3"] == "h3" and silent["hosts"]["1"] == "?"


def test_nothing_is_watched_before_the_first_step_or_after_rest_unless_startup_is_set(tmp_path):
    clock, exits = Clock(), {}
    (dog,) = ranks(tmp_path / "a", 1, clock, [], exits)
    clock.now += 100
    assert dog.check() == "off"
    dog.beat(1)
    dog.rest()
    clock.now += 100
    assert dog.check() == "off"
    (early,) = ranks(tmp_path / "b", 1, clock, [], exits, startup_s=30.0)
    clock.now += 31
    assert early.check() == "fired"
    (after,) = ranks(tmp_path / "c", 1, clock, [], exits, startup_s=30.0)
    after.beat(1)
    after.rest()  # the loop ended: not even startup_s applies any more
    clock.now += 31
    assert after.check() == "off"


def test_the_verdict_is_written_even_when_the_requeue_fails(tmp_path):
    clock, exits = Clock(), {}

    def refuse(report: dict) -> dict:
        raise RuntimeError("scontrol: Requested operation is presently disabled")

    dog = watchdog.Watchdog(tmp_path, 0, 1, "node1", 5.0, refuse, clock=clock, exit=lambda c: exits.setdefault(0, c))
    dog.beat(1)
    clock.now += 6
    assert dog.check() == "fired" and dog.check() == "ended"  # a world of one: every rank answered
    assert exits == {0: 1} and "presently disabled" in dog.hang.report()["decision"]["why"]


def test_a_normal_exit_leaves_no_hang_directory(tmp_path):
    dog = watchdog.Watchdog(hangs.attempt_dir(tmp_path, "12", 0), 0, 1, "node1", 5.0, dict, poll_s=0.05)
    dog.start()
    dog.beat(1)
    dog.stop()
    assert not (tmp_path / hangs.HANGS).exists()


def test_hang_requeues_are_capped_by_max_hangs():
    assert verdict.decide("hang", "RUNNING", 0, 3, hangs_done=2, max_hangs=3).requeue
    refused = verdict.decide("hang", "RUNNING", 0, 3, hangs_done=3, max_hangs=3)
    assert not refused.requeue and "max_hangs=3" in refused.why and "HINT:" in refused.why


@pytest.mark.parametrize("value, expected", [(None, watchdog.DEFAULT_WATCHDOG_S), (0, None), (2.5, 2.5)])
def test_watchdog_time_from_argument_or_default(monkeypatch, value, expected):
    monkeypatch.delenv("HPC_WATCHDOG_S", raising=False)
    assert watchdog.configured(value) == expected


def test_watchdog_time_from_the_environment(monkeypatch):
    monkeypatch.setenv("HPC_WATCHDOG_S", "0")
    assert watchdog.configured(None) is None
    monkeypatch.setenv("HPC_WATCHDOG_S", "five")
    with pytest.raises(ValueError, match="HPC_WATCHDOG_S='five'.*HINT"):
        watchdog.configured(None)


def test_flight_recorder_dumps_into_the_attempt_directory(tmp_path):
    env = hangs.flight_recorder_env(tmp_path / "hangs" / "7.1")
    assert env["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1" and int(env["TORCH_FR_BUFFER_SIZE"]) > 0
    assert env["TORCH_FR_DUMP_TEMP_FILE"] == env["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] == str(
        tmp_path / "hangs" / "7.1" / "nccl" / "rank-")
    assert (tmp_path / "hangs" / "7.1" / "nccl").is_dir()


def test_a_stopped_rank_ends_the_others_with_stacks_and_a_report(tmp_path):
    """Rank 1 stops itself after step 3; rank 0 is blocked in the next gradient all-reduce. Not
    under SLURM there is nothing to requeue, so rank 0 ends with status 1 (under srun
    --kill-on-bad-exit that ends the step)."""
    procs = launch("stall", 2, tmp_path, {"watchdog_s": 2, "stop_rank": 1, "stop_at": 3, "steps": 50,
                                         "timeout_s": 600})
    try:
        code = procs[0].wait(timeout=120)
    finally:
        procs[1].kill()
        procs[1].wait()
    err = procs[0].stderr.read()
    assert code == 1, err
    (attempt,) = (tmp_path / hangs.HANGS).iterdir()
    report = json.loads((attempt / hangs.REPORT).read_text())
    assert report["stuck"] == [1] and report["answered"] == [0] and report["last_step"] == 3
    assert "not running under SLURM" in report["decision"]["why"]
    stacks = (attempt / "rank-0.txt").read_text()
    assert "hang_workload.py" in stacks and "stall" in stacks  # the main thread, in the training loop
    assert "did not answer" in err


def test_the_training_timeout_replaces_the_startup_timeout(tmp_path):
    """After training_started() an all-reduce that a peer never joins raises after the training
    timeout (2 s), long before the start-up timeout (600 s) would."""
    procs = launch("timeout", 2, tmp_path, {"timeout_s": 600, "train_timeout_s": 2})
    try:
        codes = [p.wait(timeout=90) for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert codes == [0, 0], [p.stderr.read() for p in procs]
    assert json.loads((tmp_path / "outcome.json").read_text())["outcome"] == "raised"
