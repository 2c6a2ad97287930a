"""Submissions into one run directory, one at a time: concurrent processes lose no manifest entry and
run no task twice; a second submission waits for the first, or is refused after a bounded wait.

    python -m pytest tests/test_submit_concurrent.py -q
"""
import os
import threading
import time

import pytest

from hpc.pipeline import plan
from hpc.rundir import run as rundir
from hpc import submit
from hpc.rundir.run import RunDir
from tests.submit_race import attempts, race


@pytest.fixture(autouse=True)
def tiny(monkeypatch):
    monkeypatch.setitem(plan.PIPELINES, "tiny", "tests.tiny_pipeline")


@pytest.mark.parametrize("executor, rounds, submitters", [("debug", 5, 3), ("local", 2, 2)])
def test_concurrent_submissions_lose_no_entry_and_run_each_task_once(tmp_path, executor, rounds, submitters):
    done, expected, lost = race(rounds=rounds, submitters=submitters, root=tmp_path, executor=executor)
    assert (done, expected, lost) == (rounds, rounds * 4, 0)  # the 4 tiny tasks once per round
    assert [attempts(tmp_path / f"round-{r}") for r in range(rounds)] == [[1, 1, 1, 1]] * rounds


def test_a_second_submission_is_refused_after_a_bounded_wait(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(rundir, "LOCK_WAIT_S", 0.5)
    with RunDir(tmp_path).submission_lock():
        code = submit.main(["tiny", "--cluster", "debug", "--run-dir", str(tmp_path)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 2, err
    assert err[0].startswith("waiting up to 0.5 s for pid") and f"pid {os.getpid()}" in err[0]
    assert err[1].startswith("error: run dir") and "still after 0.5 s" in err[1] and "HINT" in err[1]
    assert not RunDir(tmp_path).manifest_path.exists()  # it submitted nothing


def test_a_second_submission_waits_for_the_first(tmp_path, capsys):
    held, release = threading.Event(), threading.Event()

    def first():
        with RunDir(tmp_path).submission_lock():
            held.set()
            release.wait(60)

    holder = threading.Thread(target=first)
    holder.start()
    held.wait(60)
    threading.Timer(1.0, release.set).start()  # the wait bound (LOCK_WAIT_S) is far longer
    started = time.monotonic()
    assert submit.main(["tiny", "--cluster", "debug", "--run-dir", str(tmp_path)]) == 0
    holder.join()
    assert time.monotonic() - started >= 1.0
    assert "waiting up to" in capsys.readouterr().err
    assert RunDir(tmp_path).is_done("second", 2)
