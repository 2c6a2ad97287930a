"""Arrays on the real local SLURM cluster: per-item dependencies (aftercorr), arrays split at the
cluster's MaxArraySize, and array_parallelism. Uses the tiny pipeline's `follow` stage, whose item
k waits only for second[k].

    python -m pytest tests/slurm/test_arrays.py -m slurm
"""
import re
import subprocess
from datetime import datetime

import pytest

from hpc.pipeline import plan
from hpc.slurm import scheduler
from tests.slurm.test_pipeline import ROOT, ended, job_ids, run_tiny, wait_until

pytestmark = pytest.mark.slurm
ONE_RANK = ("stages.second.nodes=1", "stages.second.tasks_per_node=1")


@pytest.fixture(autouse=True)
def tiny(monkeypatch):
    monkeypatch.setitem(plan.PIPELINES, "tiny", "tests.tiny_pipeline")
    monkeypatch.chdir(ROOT)  # jobs import tests.tiny_pipeline from the submission directory


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
