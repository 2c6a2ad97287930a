"""The picture of a run (hpc.monitor.timeline, hpc.monitor.timeline_plot) from sacct's records or, without
accounting, from the logs: one bar per attempt with its world size, and the SVG that shows it.
The preempted run on the cluster is in tests/slurm/test_pipeline.py.

    python -m pytest tests/test_timeline.py -q
"""
import json
import re

import pytest

from hpc import status
from hpc.monitor import timeline, timeline_plot
from hpc.config.schema import ConfigError
from hpc.rundir.run import RunDir

T0 = 1_700_000_000.0


def at(seconds):
    """sacct's way of writing T0 + seconds (local time)."""
    import time

    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(T0 + seconds))


def record(submit, eligible, start, end, state, reason="None"):
    return {"Submit": at(submit), "Eligible": at(eligible) if eligible is not None else "Unknown",
            "Start": at(start) if start is not None else "Unknown",
            "End": at(end) if end is not None else "Unknown", "State": state, "Reason": reason}


def test_a_preempted_job_has_one_bar_per_attempt_with_its_world_size():
    records = [record(0, 10, 12, 40, "PREEMPTED"), record(45, 48, 50, 70, "COMPLETED")]
    segs = timeline.from_history(records, T0, True, {0: 4, 1: 2}, "attempt-second[0]-7", T0 + 100)
    assert [(s.kind, s.start - T0, s.end - T0, s.label, s.gid) for s in segs] == [
        ("dependency", 0, 10, "", ""), ("queued", 10, 12, "", ""),
        ("PREEMPTED", 12, 40, "4 ranks", "attempt-second[0]-7-1"),
        ("requeued", 40, 50, "", ""),
        ("COMPLETED", 50, 70, "2 ranks", "attempt-second[0]-7-2")]


def test_waiting_and_running_jobs_reach_now():
    pending = timeline.from_history([record(0, None, None, None, "PENDING", "Dependency")], T0, True, {}, "g",
                                    T0 + 30)
    assert [(s.kind, s.end - T0) for s in pending] == [("dependency", 30)]
    running = timeline.from_history([record(0, 0, 5, None, "RUNNING")], T0, False, {0: 1}, "g", T0 + 30)
    assert [(s.kind, s.start - T0, s.end - T0, s.label) for s in running] == [("queued", 0, 5, ""),
                                                                              ("RUNNING", 5, 30, "1 rank")]
    # submitit's own requeue (time limit near) ends an attempt in REQUEUED
    requeued = timeline.from_history([record(0, 0, 1, 9, "REQUEUED"), record(9, 9, 10, 12, "TIMEOUT")], T0,
                                     False, {}, "g", T0 + 30)
    assert [s.kind for s in requeued if s.gid] == ["REQUEUED", "TIMEOUT"]
    # a job that requeued itself on a preemption (hpc.recovery.preemption) reads REQUEUED; its record says why
    why = timeline.from_history([record(0, 0, 1, 9, "REQUEUED"), record(9, 9, 10, 12, "COMPLETED")], T0,
                                False, {}, "g", T0 + 30, [(T0 + 8.5, "PREEMPTED")])
    assert [s.kind for s in why if s.gid] == ["PREEMPTED", "COMPLETED"]


def _log_line(seconds, text):
    import time

    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(T0 + seconds))
    return f"submitit INFO ({stamp},250) - {text}\n"


def fake_run(tmp_path, job_id="41"):
    """A run whose one task started twice (requeued on 4, then on 2 ranks) and then finished,
    as its manifest, rank-0 log and done marker tell it: no scheduler to ask."""
    run = RunDir(tmp_path / "run")
    run.start("tiny", "{}\n", "local")
    run.record("main", None, job_id, "local")
    manifest = json.loads(run.manifest_path.read_text())
    manifest["tasks"]["main"]["jobs"][0]["submitted"] = at(0)
    run.manifest_path.write_text(json.dumps(manifest))
    log = run.log_path("main", job_id)
    log.parent.mkdir(parents=True)
    log.write_text(_log_line(2, "Starting with JobEnvironment(job_id=41)")
                   + "[hpc] stage main item None rank 0/4 on 2 node(s) job 41 restart 0\nstep 1\n"
                   + _log_line(20, "Starting with JobEnvironment(job_id=41)")
                   + "[hpc] stage main item None rank 0/2 on 1 node(s) job 41 restart 1\n"
                   + _log_line(29, "Job completed successfully"))
    run.mark_done("main", None, {"started": T0 + 20, "finished": T0 + 30, "world_size": 2})
    return run


def test_without_accounting_the_attempts_come_from_the_log(tmp_path):
    run = fake_run(tmp_path)
    lanes = timeline.lanes(run, None, {"main": "COMPLETED"}, T0 + 100)
    assert [lane.name for lane in lanes] == ["main"]
    assert [(s.kind, round(s.start - T0, 2), round(s.end - T0, 2), s.label) for s in lanes[0].segments] == [
        ("queued", 0, 2.25, ""), ("REQUEUED", 2.25, 20.25, "4 ranks"), ("COMPLETED", 20.25, 30, "2 ranks")]
    (run.task_dir("main") / timeline.STOPS).parent.mkdir()
    (run.task_dir("main") / timeline.STOPS).write_text(json.dumps(
        {"preemptions": 1, "events": [{"time": T0 + 15, "restart": "0", "kind": "preempt"}]}))
    kinds = [s.kind for s in timeline.lanes(run, None, {"main": "COMPLETED"}, T0 + 100)[0].segments]
    assert kinds == ["queued", "PREEMPTED", "COMPLETED"]


def test_the_svg_has_each_attempt_and_its_world_size(tmp_path, capsys):
    run = fake_run(tmp_path)
    out = tmp_path / "run.svg"
    assert status.main([str(run.path), "--timeline", str(out)]) == 0
    assert "wrote" in capsys.readouterr().out
    svg = out.read_text()
    assert re.findall(r'id="(attempt-[^"]+)"', svg) == ["attempt-main-41-1", "attempt-main-41-2"]
    assert svg.count(">4 ranks<") == 1 and svg.count(">2 ranks<") == 1  # text stays text
    assert "stopped and requeued" in svg and "completed" in svg  # the legend names each kind shown
    png = tmp_path / "run.png"
    assert status.main([str(run.path), "--timeline", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bad_names_and_a_missing_matplotlib_are_one_line_errors(tmp_path, capsys, monkeypatch):
    run = fake_run(tmp_path)
    assert status.main([str(run.path), "--timeline", str(tmp_path / "run.pdf")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "expected one of ['.svg', '.png']" in err and "HINT" in err
    real = timeline_plot.importlib.util.find_spec
    monkeypatch.setattr(timeline_plot.importlib.util, "find_spec",
                        lambda name, *a: None if name == "matplotlib" else real(name, *a))
    with pytest.raises(ConfigError, match=r"needs matplotlib.*HINT: pip install 'hpc\[plot\]'"):
        timeline_plot.check("run.svg")
    assert status.main([str(run.path), "--timeline", str(tmp_path / "run.svg")]) == 2
    assert "pip install 'hpc[plot]'" in capsys.readouterr().err
