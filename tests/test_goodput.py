"""Goodput of an attempt, a task and a run (hpc.monitor.goodput, hpc.monitor.cost): the parts of each
allocation from SLURM's attempt spans and rank 0's records, against golden files; the parts add up.
The sandbox run with an injected preemption is tests/slurm/test_goodput_cluster.py.

    python -m pytest tests/test_goodput.py -q      # HPC_UPDATE_GOLDEN=1 rewrites the golden files
"""
import json
import os
from pathlib import Path

import pytest

from hpc.monitor import goodput

GOLDEN = Path(__file__).parent / "golden" / "goodput"


def rec(job, restart=0, resumed=0, first=None, saves=(), stall=0.0, ended=None, end=None, began=None):
    out = {"job": job, "restart": restart, "resumed": resumed, "began": began if began is not None else first,
           "saves": [list(s) for s in saves], "stall_s": stall}
    if first is not None:
        out["first_step"] = first
    if ended is not None:
        out.update(ended=ended, end=end)
    return out


# name -> (attempts, records): each attempt (job, restart, start, end, state, units, queued)
CASES = {
    "completed": ([("7", 0, 0, 65, "COMPLETED", 4, 3)],
                  [rec("7", first=10, saves=[(10, 30, 2), (20, 50, 4)], stall=5, ended=60, end="completed")]),
    "killed_then_resumed": ([("7", 0, 0, 100, "PREEMPTED", 2, 5), ("7", 1, 120, 200, "COMPLETED", 2, 20)],
                            [rec("7", first=10, saves=[(10, 40, 1), (20, 70, 2)], stall=2),
                             rec("7", 1, resumed=20, first=130, ended=190, end="completed")]),
    "stopped_gracefully": ([("7", 0, 0, 100, "PREEMPTED", 1, 0), ("7", 1, 110, 150, "COMPLETED", 1, 10)],
                           [dict(rec("7", first=10, saves=[(10, 40, 1), (17, 90, 3)], stall=3, ended=92, end="stopped"), step=17),
                            rec("7", 1, resumed=17, first=120, ended=150, end="completed")]),
    # a hang: the watchdog's verdict requeued it (os._exit, no end recorded) 30 s after its last save of step 20
    "hung_then_resumed": ([("7", 0, 0, 100, "REQUEUED", 2, 5), ("7", 1, 120, 200, "COMPLETED", 2, 20)],
                          [dict(rec("7", first=10, saves=[(10, 40, 1), (20, 70, 2)], stall=2), step=20),
                           rec("7", 1, resumed=20, first=130, ended=190, end="completed")]),
    "failed_last": ([("8", 0, 0, 80, "FAILED", 1, 0)],
                    [rec("8", first=20, saves=[(5, 50, 1)], stall=1)]),
    "no_record": ([("9", 0, 0, 30, "PREEMPTED", 8, 0), ("9", 1, 40, 70, "COMPLETED", 8, 10)], []),
    "running": ([("7", 0, 0, 50, "RUNNING", 1, 2)], [rec("7", first=5, saves=[(10, 30, 1)], stall=1)]),
    # a `run` script seen from outside: its start, the step-N/ folders committed by its end, no step of its own
    "run_script": ([("5", 0, 0, 60, "PREEMPTED", 2, 0), ("5", 1, 70, 100, "COMPLETED", 2, 10)],
                   [rec("5", first=4, saves=[(100, 40, 0.0), (200, 50, 0.0)], ended=57, end="stopped"),
                    rec("5", 1, resumed=200, first=74, ended=99, end="completed")]),
}


def splits(name):
    attempts, records = CASES[name]
    return goodput.task([goodput.Attempt(*a) for a in attempts], records)


@pytest.mark.parametrize("name", sorted(CASES))
def test_each_case_matches_its_golden_file_and_adds_up(name):
    found = splits(name)
    for sp, a in zip(found, sorted(CASES[name][0], key=lambda a: a[2])):
        assert sp.allocated_s == pytest.approx(a[3] - a[2])  # the parts add up to the attempt's span
        assert all(v >= 0 for v in sp.seconds.values()), sp.seconds
    text = json.dumps({"attempts": [sp.seconds for sp in found],
                       "task": goodput.as_dict(goodput.total(found))}, indent=1, sort_keys=True) + "\n"
    path = GOLDEN / f"{name}.json"
    if os.environ.get("HPC_UPDATE_GOLDEN"):
        path.write_text(text)
    assert text == path.read_text()


def test_a_kill_redoes_the_steps_after_the_checkpoint_resumed_from():
    first, second = splits("killed_then_resumed")
    assert first.seconds == {"startup": 10, "training": 58, "redone": 30, "checkpoint": 2, "teardown": 0,
                             "failures": 0}
    assert second.seconds["startup"] == 10 and second.seconds["teardown"] == 10
    whole = goodput.total([first, second])
    assert whole.allocated_s == 2 * (100 + 80) and whole.queued_s == 25  # unit-seconds; queue in wall time


def test_a_hang_redoes_what_followed_its_last_save_though_its_record_names_that_step():
    first, _ = splits("hung_then_resumed")
    assert first.seconds == {"startup": 10, "training": 58, "redone": 30, "checkpoint": 2, "teardown": 0,
                             "failures": 0}


def test_a_graceful_stop_redoes_nothing_and_its_exit_is_teardown():
    first, _ = splits("stopped_gracefully")
    assert first.seconds["redone"] == 0 and first.seconds["teardown"] == 100 - 90
    assert first.seconds["training"] == 90 - 10 - 3


def test_a_script_stopped_after_its_newest_checkpoint_redoes_what_followed_it():
    first, _ = splits("run_script")
    assert first.seconds["redone"] == 57 - 50 and first.seconds["teardown"] == 60 - 57
    assert first.seconds["training"] == 50 - 4 and first.seconds["startup"] == 4


def test_a_failure_loses_what_followed_its_last_checkpoint():
    (only,) = splits("failed_last")
    assert only.seconds["failures"] == 30 and only.seconds["redone"] == 0 and only.seconds["teardown"] == 0
    assert only.seconds["startup"] == 20 and only.seconds["training"] == 29


def test_the_records_alone_give_the_status_column():
    records = CASES["killed_then_resumed"][1]
    for r in records:
        r["process_start"] = r["first_step"] - 5
    share = goodput.share(records, "COMPLETED", now=1000)
    assert 0 < share < 1
    assert goodput.share([], "RUNNING", now=1000) is None


def test_status_cost_splits_a_run_with_a_requeue_and_the_parts_add_up(tmp_path, capsys):
    """The timeline's run without accounting (requeued on 4 ranks, then 2: one GPU each) with rank 0's
    records: python -m hpc.status RUN --cost, as a table and as JSON."""
    from hpc import status
    from tests.test_timeline import T0, fake_run

    run = fake_run(tmp_path)
    run.config_path.write_text("stages:\n  main:\n    nodes: 1\n    gpus_per_node: 2\n    tasks_per_node: 2\n")
    records = [rec("41", 0, first=T0 + 6.25, saves=[(5, T0 + 12.25, 0.5)], stall=0.5),
               rec("41", 1, resumed=5, first=T0 + 22.25, ended=T0 + 29, end="completed")]
    (run.task_dir("main") / "attempts.json").write_text(json.dumps({"attempts": records}))
    assert status.main([str(run.path), "--cost", "--json"]) == 0
    found = json.loads(capsys.readouterr().out)
    (task,) = found["tasks"]
    hours = task["gpu_hours"]
    assert hours["allocated"] == pytest.approx((18 * 4 + 9.75 * 2) / 3600, abs=1e-5)  # 4 GPUs, then 2
    assert sum(hours[k] for k in goodput.PARTS) == pytest.approx(hours["allocated"], abs=1e-5)
    assert hours["redone"] == pytest.approx(8 * 4 / 3600, abs=1e-5)  # step 5's checkpoint to the requeue
    assert hours["startup"] == pytest.approx((4 * 4 + 2 * 2) / 3600, abs=1e-5)
    assert task["attempts"] == 2 and task["queue_wait_hours"] == pytest.approx(2.25 / 3600, abs=1e-5)
    assert found["run"]["gpu_hours"] == found["stages"]["main"]["gpu_hours"]
    assert status.main([str(run.path), "--cost"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split()[:4] == ["TASK", "ATTEMPTS", "ALLOC", "TRAINING"]
    assert [line.split()[0] for line in table[1:4]] == ["main", "stage", "run"] and "GPU-h" in table[1]
    import hpc

    (run.task_dir("main") / "metrics.json").write_text('{"loss": 0.5}')
    got = hpc.Run(run.path).metrics(goodput=True)["main"]
    assert got["loss"] == 0.5 and got["goodput"]["gpu_hours"] == hours and got["goodput"]["attempts"] == 2
    assert hpc.Run(run.path).metrics() == {"main": {"loss": 0.5}}


def test_the_timeline_shows_lost_time_and_an_attempt_on_new_software(tmp_path, capsys):
    from hpc import status
    from hpc.monitor import timeline
    from tests.test_timeline import T0, fake_run

    run = fake_run(tmp_path)
    records = [dict(rec("41", 0, first=T0 + 6.25, saves=[(5, T0 + 12.25, 0.5)], stall=0.5), software_digest="a"),
               dict(rec("41", 1, resumed=5, first=T0 + 22.25, ended=T0 + 29, end="completed"), software_digest="b")]
    (run.task_dir("main") / "attempts.json").write_text(json.dumps({"attempts": records}))
    (lane,) = timeline.lanes(run, None, {"main": "COMPLETED"}, T0 + 100)
    strips = [(s.kind, round(s.start - T0, 2), round(s.end - T0, 2)) for s in lane.segments if s.kind in timeline.LOST]
    assert strips == [("startup", 2.25, 6.25), ("redone", 12.25, 20.25), ("startup", 20.25, 22.25),
                      ("teardown", 29, 30)]
    assert [s.label for s in lane.segments if s.gid] == ["4 ranks", "2 ranks · new software"]
    out = tmp_path / "run.svg"
    assert status.main([str(run.path), "--timeline", str(out)]) == 0
    svg = out.read_text()
    assert "training redone after a resume" in svg and "new software" in svg and "start-up" in svg


def test_status_shows_a_goodput_column_and_a_resume_onto_other_software(tmp_path, capsys):
    from hpc import status
    from tests.test_timeline import T0, fake_run

    run = fake_run(tmp_path)
    soft = {"torch": "2.3.0", "python": "3.11.7", "packages": "abc"}
    records = [dict(rec("41", 0, first=T0 + 6.25, saves=[(5, T0 + 12.25, 0.5)], stall=0.5), process_start=T0 + 3,
                    software=soft),
               dict(rec("41", 1, resumed=5, first=T0 + 22.25, ended=T0 + 29, end="completed"), process_start=T0 + 21,
                    software=dict(soft, torch="2.4.0"))]
    (run.task_dir("main") / "attempts.json").write_text(json.dumps({"attempts": records}))
    assert status.main([str(run.path)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1].split()[7:9] == ["GOODPUT", "PROGRESS"]
    share = goodput.share(records, "COMPLETED", T0 + 100)
    assert out[2].split()[7] == f"{share:.0%}" and 0 < share < 1
    assert "  main software: attempt 2 (job 41) ran on different software: torch 2.3.0 -> 2.4.0; not a bitwise " \
           "resume" in out
    assert status.main([str(run.path), "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert row["goodput"] == pytest.approx(share) and "torch 2.3.0 -> 2.4.0" in row["software"]
    assert "attempts.json" not in row["outputs"]


def test_a_run_stage_records_what_its_wrapper_sees(tmp_path):
    """`run` on the local executor: the wrapper's record has the script's start, the step-N/ folder it
    committed (its time) and its end, and no step of its own: what followed that checkpoint is unknown."""
    import hpc
    from hpc.rundir import attempts

    script = tmp_path / "train.py"
    script.write_text("import os, pathlib\n"
                      "d = pathlib.Path(os.environ['HPC_CHECKPOINT_DIR']) / 'step-3'\n"
                      "d.mkdir(parents=True); (d / 'COMPLETE.json').write_text('{}')\n")
    run = hpc.submit("run", cluster="local", run_dir=tmp_path / "run", command=f"python {script}")
    assert run.done()
    (entry,) = attempts.load(tmp_path / "run" / "main")
    assert entry["kind"] == "run" and entry["end"] == "completed" and "step" not in entry
    assert [s[0] for s in entry["saves"]] == [3] and entry["began"] <= entry["first_step"] <= entry["ended"]
    assert entry["software"]["python"]
