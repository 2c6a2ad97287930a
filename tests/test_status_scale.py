"""hpc.status at 10,000 tasks: the work per task and per point, counted (files looked up, listed,
opened), not timed; and a table that reads at that size (a count by state, what needs a look first).

    python -m pytest tests/test_status_scale.py -q

The scheduler's answer is built here (scheduler.Answer, as sacct's would read) and handed to
collect(), as a sweep's poll hands every point the one answer it got.
"""
import collections
import io
import os

import pytest

from hpc.monitor import status, sweeps, table
from hpc.fs import atomic
from hpc.rundir.run import RunDir, add_jobs
from hpc.rundir.sweepdir import SweepDir
from hpc.slurm import scheduler
from hpc.sweep import grid

STATES = ("COMPLETED", "RUNNING", "PENDING", "FAILED", "TIMEOUT")


def _answer(ids):
    """Records for every job: mostly COMPLETED, some of each other state, as sacct would give them."""
    records = {jid: scheduler.JobRecord(jid, STATES[n % 50 % len(STATES)] if n % 50 < 5 else "COMPLETED", "", "",
                                        "00:01:00", "", "", "0:0", "node1", 0) for n, jid in enumerate(ids)}
    return scheduler.Answer(records, "sacct"), {}


@pytest.fixture
def calls(monkeypatch):
    """Counts of the file system calls made: lookups (stat), listings, opens."""
    seen = collections.Counter()

    def counting(name, real):
        def call(*a, **k):
            seen[name] += 1
            return real(*a, **k)
        return call

    for name in ("stat", "lstat", "listdir", "scandir"):
        monkeypatch.setattr(os, name, counting(name, getattr(os, name)))
    monkeypatch.setattr(io, "open", counting("open", io.open))
    return seen


def test_a_run_of_10000_tasks_costs_a_few_calls_per_task(tmp_path, calls):
    run = RunDir(tmp_path / "run")
    ids = [f"700_{i}" for i in range(10_000)]
    with atomic.batched(tmp_path):  # the set-up: no fsync per file
        run.start("tiny", "{}\n", "slurm")
        run.record_all("work", list(zip(range(10_000), ids)), "slurm")
        for i in range(0, 10_000, 50):  # some of them wrote their done marker
            run.mark_done("work", i, {"world_size": 2, "nodes": 1, "started": 0.0, "finished": 60.0})
    answer = _answer(ids)
    calls.clear()
    rows = status.collect(run, answer)
    assert len(rows) == 10_000
    assert calls["open"] <= 1 + 200 + 10, calls  # the manifest once, each done marker once
    per_task = (calls["stat"] + calls["lstat"] + calls["listdir"] + calls["scandir"]) / 10_000
    assert per_task <= 2.5, calls  # a listing of the task's directory, one of its logs when it ran
    assert {r.world_size for r in rows[::50]} == {2}
    # the table: a count by state, then what needs a look (failed, running) before what is done
    summary = table.by_state([r.state for r in rows])
    assert summary == "10000 task(s): 200 FAILED, 200 TIMEOUT, 200 RUNNING, 200 PENDING, 9200 COMPLETED", summary
    states = [line.split()[2] for line in table.format_table(rows).splitlines()[1:10_001]]
    assert states == sorted(states, key=table.rank) and states[0] == "FAILED" and states[-1] == "COMPLETED"
    assert states.index("RUNNING") == 400


def test_a_sweep_poll_reads_each_points_manifest_once_and_no_task_files(tmp_path, calls, monkeypatch):
    sweep = SweepDir(tmp_path / "s")
    points = grid.points({"tiny.score": list(range(400))})
    sweep.save("tiny", {"tiny.score": list(range(400))}, [], None, points)
    ids = []
    with atomic.batched(tmp_path):  # the set-up: no fsync per file
        for n, p in enumerate(points):
            jobs = [(None, f"800_{n}"), (0, f"801_{2 * n}"), (1, f"801_{2 * n + 1}")]
            data = sweep.point(p.signature).begin("tiny", "slurm")
            add_jobs(data, "first", jobs[:1], "slurm")
            add_jobs(data, "second", jobs[1:], "slurm")
            sweep.point(p.signature).write_manifest(data)
            ids += [j for _, j in jobs]
    answer = _answer(ids)
    calls.clear()
    monkeypatch.setattr(status, "query_run", lambda *runs: answer)  # sacct cannot run here
    rows = sweeps.collect(sweep)
    assert len(rows) == 400 and {r.tasks.split("/")[1] for r in rows} == {"3"}
    assert calls["open"] <= 1 + 400, calls  # sweep.json, then each point's manifest once
    per_point = sum(calls[k] for k in ("stat", "lstat", "listdir", "scandir")) / 400
    assert per_point <= 8, calls  # its manifest, its metrics' directories; nothing per task
    table = sweeps.format_table(rows).splitlines()
    assert table[0].startswith("400 point(s): ") and table[2].split()[2] == "FAILED", table[:3]
