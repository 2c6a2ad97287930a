"""Arrays on the real local SLURM cluster: per-item dependencies (aftercorr), arrays split at the
cluster's MaxArraySize, and array_parallelism. Uses the tiny pipeline's `follow` stage, whose item
k waits only for second[k].

    python -m pytest tests/slurm/test_arrays.py -m slurm
"""
import re
import subprocess
import threading
import time
from datetime import datetime

import pytest

from hpc.cluster.preempt import job_field, preempt
from hpc.slurm import scheduler
from tests.slurm.test_pipeline import counting_path, ended, job_ids, run_tiny, wait_until
from tests.slurm.pipelines import use_pipelines

pytestmark = pytest.mark.slurm
ONE_RANK = ("stages.second.nodes=1", "stages.second.tasks_per_node=1")


tiny = use_pipelines(tiny="tests.tiny_pipeline")


@pytest.fixture
def max_array_size_4(slurm_cluster):
    """The session cluster with MaxArraySize=4 (task ids 0-3) for one test, then as it was."""
    conf = slurm_cluster.conf
    original = conf.read_text()
    small = re.sub(r"(?m)^MaxArraySize=\d+\n", "", original) + "MaxArraySize=4\n"
    try:
        conf.write_text(small)
        subprocess.run(["scontrol", "reconfigure"], check=True)
        assert scheduler.max_array_size() == 4
        yield 4
    finally:
        conf.write_text(original)
        subprocess.run(["scontrol", "reconfigure"], check=True)


def at(record, field):
    return datetime.fromisoformat(getattr(record, field))


def test_a_slow_item_does_not_hold_back_the_next_stage_of_the_others(slurm_cluster, tmp_path):
    # second[1] works until the test creates `release`, which it does only once follow[0] and
    # follow[2] have run: with afterok on the whole of `second`, they would wait for ever
    release = tmp_path / "release"
    run = run_tiny(tmp_path / "run", "tiny.follow=true", "tiny.slow_items=[1]", f"tiny.release_file={release}",
                   *ONE_RANK)
    ids = job_ids(run)
    assert {i: run.dependencies()[ids[("follow", i)]] for i in (0, 1, 2)} == {
        i: [ids[("second", i)]] for i in (0, 1, 2)}  # each item's own task, and only that
    wait_until(lambda: run.is_done("follow", 0) and run.is_done("follow", 2), timeout_s=90,
               what="follow[0] and follow[2] to run while second[1] still works")
    assert not run.is_done("second", 1) and not run.is_done("follow", 1)
    release.write_text("")
    records = wait_until(lambda: ended(run), what="every job to end")
    assert {k: records[j].state for k, j in ids.items()} == {k: "COMPLETED" for k in ids}
    for i in (0, 1, 2):
        assert at(records[ids[("follow", i)]], "start") >= at(records[ids[("second", i)]], "end")
    assert at(records[ids[("follow", 0)]], "end") <= at(records[ids[("second", 1)]], "end")


def test_arrays_above_max_array_size_are_split_and_keep_their_dependencies(max_array_size_4, tmp_path, capsys):
    # 6 items, MaxArraySize 4: second and follow are two arrays each (4 + 2 tasks), two tasks at a
    # time; second[5] fails once, so the resubmission reruns it alone and follow[5] names its task
    run = run_tiny(tmp_path / "run", "tiny.parts=[0,1,2,3,4,5]", "tiny.follow=true", "tiny.third=true",
                   "tiny.fail_items=[5]", "stages.second.array_parallelism=2", *ONE_RANK)
    assert "6 items, more than the cluster's MaxArraySize 4: submitted as 2 arrays" in capsys.readouterr().out
    first = job_ids(run)
    arrays = {stage: sorted({first[(stage, i)].split("_")[0] for i in range(6)}) for stage in ("second", "follow")}
    assert [len(a) for a in arrays.values()] == [2, 2]
    throttle = {scheduler.job_info(base).get("ArrayTaskThrottle") for base in arrays["second"]}
    assert throttle == {"2"}
    wait_until(lambda: ended_but(run, ("follow", 5), ("third", None)), what="the first attempt to end")
    assert submit_again(run) == 0
    after = job_ids(run)
    assert {k for k in after if after[k] != first[k]} == {("second", 5), ("follow", 5), ("third", None)}
    assert run.dependencies()[after[("follow", 5)]] == [after[("second", 5)]]
    records = wait_until(lambda: ended(run), what="every job to end")
    assert {records[j].state for j in after.values()} == {"COMPLETED"}
    for i in range(6):
        assert at(records[after[("follow", i)]], "start") >= at(records[after[("second", i)]], "end")
    assert at(records[after[("third", None)]], "start") >= max(at(records[after[("second", i)]], "end")
                                                              for i in range(6))
    # never more than two tasks of an array at once (the first attempt's arrays)
    records = scheduler.query(first.values())
    for base in arrays["second"]:
        tasks = [records[first[("second", i)]] for i in range(6) if first[("second", i)].startswith(base + "_")]
        assert max(sum(at(t, "start") <= at(s, "start") < at(t, "end") for t in tasks) for s in tasks) <= 2


def ended_but(run, *keys):
    """Every job of `run` has ended except those of `keys`, which wait on a failed task."""
    ids = {k: j for k, j in job_ids(run).items() if k not in keys}
    records = scheduler.query(ids.values())
    return set(records) == set(ids.values()) and all(r.state not in scheduler.ACTIVE for r in records.values())


def submit_again(run):
    from hpc import submit

    return submit.main(["tiny", "--cluster", "slurm", "--run-dir", str(run.path), "tiny.fail_items=[]"])


def test_a_partial_resubmission_is_one_array_at_its_items_task_ids(slurm_cluster, tmp_path, monkeypatch):
    # second[2], [3] and [5] work until `release` exists; follow's tasks 2, 3 and 5 wait on them and are
    # cancelled meanwhile (a user fixing follow's code): the resubmission submits follow[2], [3], [5]
    # as one array at task ids 2, 3, 5, aftercorr on second's first array, one task at a time
    release = tmp_path / "release"
    run = run_tiny(tmp_path / "run", "tiny.parts=[0,1,2,3,4,5]", "tiny.follow=true", "tiny.slow_items=[2,3,5]",
                   f"tiny.release_file={release}", "stages.follow.array_parallelism=1", *ONE_RANK)
    first = job_ids(run)
    wait_until(lambda: all(run.is_done("follow", i) for i in (0, 1, 4)), timeout_s=90,
               what="follow[0], [1] and [4] to run while second[2], [3] and [5] still work")
    subprocess.run(["scancel", *(first[("follow", i)] for i in (2, 3, 5))], check=True)
    wait_until(lambda: ended_but(run, *(("second", i) for i in (2, 3, 5))), what="follow's held tasks to be cancelled")
    path, log = counting_path(tmp_path)
    monkeypatch.setenv("PATH", path)
    assert submit_again(run) == 0
    assert log.read_text().split().count("sbatch") == 1  # one array, not one job per item
    after = job_ids(run)
    array = after[("follow", 2)].split("_")[0]
    assert [after[("follow", i)] for i in (2, 3, 5)] == [f"{array}_{i}" for i in (2, 3, 5)]
    second = first[("second", 2)].split("_")[0]
    info = scheduler.job_info(array)
    assert info.get("Dependency", "").startswith(f"aftercorr:{second}"), info
    assert info.get("ArrayTaskThrottle") == "1", info
    assert run.dependencies()[after[("follow", 3)]] == [first[("second", 3)]]
    release.write_text("")
    records = wait_until(lambda: ended(run), what="every job to end")
    assert {records[after[("follow", i)]].state for i in (2, 3, 5)} == {"COMPLETED"}
    for i in (2, 3, 5):  # each task ran its own item, after its own upstream task
        assert at(records[after[("follow", i)]], "start") >= at(records[first[("second", i)]], "end")
        assert f"stage follow item {i} " in run.log_path("follow", after[("follow", i)]).read_text()
    spans = sorted((at(records[after[("follow", i)]], "start"), at(records[after[("follow", i)]], "end"))
                   for i in (2, 3, 5))
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))  # %1: one at a time


def test_a_sweeps_next_stage_waits_point_by_point(max_array_size_4, tmp_path, monkeypatch):
    # 5 points, MaxArraySize 4: `first` is two arrays (4 + 1 tasks), so is `second`. Point 0's first
    # task works for 60 s: the other points' second tasks run meanwhile, each after its own point's
    from hpc import submit
    from hpc.rundir import sweepdir
    from hpc.sweep import grid

    path, log = counting_path(tmp_path)
    monkeypatch.setenv("PATH", path)
    axis = "tiny.sleep_s=60,0,0.1,0.2,0.3"
    assert submit.main(["tiny", "--cluster", "slurm", "--run-dir", str(tmp_path / "sweep"), "tiny.parts=[0]",
                        *ONE_RANK, "--sweep", axis]) == 0
    assert log.read_text().split().count("sbatch") == 4  # one per stage per MaxArraySize chunk
    sweep = sweepdir.SweepDir(tmp_path / "sweep")
    runs = [sweep.point(p.signature) for p in grid.points({"tiny.sleep_s": [60, 0, 0.1, 0.2, 0.3]})]
    ids = [job_ids(r) for r in runs]
    try:
        firsts = [i[("first", None)] for i in ids]
        seconds = [i[("second", 0)] for i in ids]
        assert [s.split("_")[0] for s in seconds[:4]] == [seconds[0].split("_")[0]] * 4
        assert scheduler.job_info(seconds[0].split("_")[0]).get("Dependency", "").startswith(
            f"aftercorr:{firsts[0].split('_')[0]}")
        assert [runs[p].dependencies()[seconds[p]] for p in range(5)] == [[f] for f in firsts]
        wait_until(lambda: all(r.is_done("second", 0) for r in runs[1:]), timeout_s=50,
                   what="points 1 to 4 to finish second while point 0's first still works")
        assert not runs[0].is_done("first") and not runs[0].is_done("second", 0)
        wanted = [*firsts[1:], *seconds[1:]]  # accounting hears of an ended task after slurmctld: wait for all
        records = wait_until(lambda: (lambda r: r if set(wanted) <= set(r) else None)(scheduler.query(wanted)),
                             timeout_s=60, what="the accounting records of points 1 to 4")
        for p in range(1, 5):
            assert at(records[seconds[p]], "start") >= at(records[firsts[p]], "end")
    finally:
        subprocess.run(["scancel", *sorted({j.split("_")[0] for i in ids for j in i.values()})], check=False)


def test_the_array_task_holding_the_arrays_record_is_requeued_alone_when_preempted_as_it_ends(
        slurm_cluster, tmp_path):
    """Two tasks of `second` without hpc's loop, each a whole node. The task holding the array's own record
    (SLURM_JOB_ID == SLURM_ARRAY_JOB_ID: the last to start) is preempted and its item ends within GraceTime,
    exiting 0: SLURM requeues no such job, and leaves it TIMEOUT where it ends past its EndTime before
    SLURM's preemption kill (its dependents never run). hpc requeues it, as J_T, never as J, which scontrol
    reads as every task (its sibling would run again). About 30 s."""
    release = tmp_path / "release"
    run = run_tiny(tmp_path / "run", "tiny.parts=[0,1]", "tiny.slow_items=[0,1]", f"tiny.release_file={release}",
                   "stages.second.nodes=1", "stages.second.tasks_per_node=1", "stages.second.cpus_per_task=8")
    tasks = {i: job_ids(run)[("second", i)] for i in (0, 1)}
    wait_until(lambda: all(job_field(slurm_cluster, t, "JobState") == "RUNNING" for t in tasks.values()),
               what="both tasks of `second` to run, one per node")
    assert job_field(slurm_cluster, tasks[1], "JobId") == tasks[1].split("_")[0]  # task 1 holds the array's record
    preemption = threading.Thread(target=preempt, args=(slurm_cluster, tasks[1]), daemon=True)
    preemption.start()
    wait_until(lambda: job_field(slurm_cluster, tasks[1], "PreemptTime") not in ("", "None"), timeout_s=30,
               what="the preemption of task 1")
    time.sleep(1)  # its step has had the SIGTERM: the item now ends within GraceTime, exiting 0
    release.write_text("")
    records = wait_until(lambda: ended(run), timeout_s=120, what="every job to end")
    preemption.join(timeout=30)
    assert {i: records[t].state for i, t in tasks.items()} == {0: "COMPLETED", 1: "COMPLETED"}
    assert [job_field(slurm_cluster, t, "Restarts") for t in tasks.values()] == ["0", "1"]
    assert f"requeued as job {tasks[1]}" in run.log_path("second", tasks[1], stream="err").read_text()
    assert run.log_path("second", tasks[0]).read_text().count("[hpc] stage second item 0 rank 0/1") == 1
