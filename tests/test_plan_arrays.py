"""Planning arrays: per-item dependencies (aftercorr) between array stages that share their items,
arrays split at the cluster's MaxArraySize, and array_parallelism.

    python -m pytest tests/test_plan_arrays.py
"""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hpc.pipeline import arrays, plan
from hpc.config import schema as config
from hpc.slurm import scheduler
from hpc.rundir.run import RunDir
from tests.test_langsplat_external import overrides, world  # noqa: F401 - world is a fixture


@pytest.fixture(autouse=True)
def tiny(monkeypatch):
    monkeypatch.setitem(plan.PIPELINES, "tiny", "tests.tiny_pipeline")


def make(*overrides, finished=frozenset(), queued=None, max_size=None, kind="slurm"):
    pipe = plan.get_pipeline("tiny")
    cfg = config.load(pipe.schema, "tiny", None, ["tiny.follow=true", *overrides])
    return plan.make_plan(pipe, cfg, "/r", kind, frozenset(finished), queued or {}, max_size)


def by_label(p):
    return {j.label: j for j in p.jobs}


def test_follow_waits_item_by_item_and_the_plan_says_so():
    p = make()
    follow = by_label(p)["follow"]
    assert follow.after == () and follow.waits == tuple(("second", k) for k in range(3))
    assert "stage follow: items [0, 1, 2] 1 rank(s) per job after second[k] for each item k (aftercorr on second)" \
        in p.summary()
    assert "#SBATCH --dependency='aftercorr:<second>'" in follow.sbatch_text()
    # at submission: the array's id, and per item the one task it waits for
    assert follow.item_dependency({"second": ["7_0", "7_1", "7_2"]}) == ("aftercorr:7", [["7_0"], ["7_1"], ["7_2"]])


def test_langsplat_external_render_waits_for_its_own_level(world):  # noqa: F811
    pipe = plan.get_pipeline("langsplat")  # not validated: only the graph is under test here
    cfg = config.load(pipe.schema, "langsplat", None, overrides(world, "fork", "langsplat.levels=[1,2,3]"),
                      extra=pipe.templates, settle=pipe.settle)
    p = plan.make_plan(pipe, cfg, "/r", "slurm")
    render = by_label(p)["render"]
    assert render.items == (1, 2, 3) and render.after == ()
    assert "#SBATCH --dependency='aftercorr:<features>'" in render.sbatch_text()
    assert "after features[k] for each item k (aftercorr on features)" in p.summary()


def test_resubmitting_one_item_names_its_own_task():
    # second[1] failed: it and follow[1] run again; second[2] and follow[2] are still queued
    done = {("first", None), ("second", 0), ("follow", 0)}
    p = make(finished=done, queued={("second", 2): "10_2", ("follow", 2): "11_2"})
    assert [(j.label, j.items) for j in p.jobs] == [("second", (1,)), ("follow", (1,))]
    follow = p.jobs[-1]
    assert "#SBATCH --dependency='afterok:<second[1]>'" in follow.sbatch_text()
    assert "after second[1] (afterok)" in p.summary()
    # a one-task submission is no array in submitit: its id has no _k
    assert follow.item_dependency({"second": ["20"]}) == ("afterok:20", [["20"]])


def test_items_waiting_on_other_task_ids_stay_one_array_at_those_ids():
    # follow[0] failed on its own (second[0] done), second[1] runs again, second[2] and [3] are
    # still queued in the first array (tasks 2 and 3), second[4] in a resubmission's (task 0)
    done = {("first", None), ("second", 0)}
    queued = {("second", 2): "10_2", ("second", 3): "10_3", ("second", 4): "12_0"}
    p = make("tiny.parts=[0,1,2,3,4]", "stages.follow.array_parallelism=1", finished=done, queued=queued)
    follow = [j for j in p.jobs if j.stage == "follow"]
    assert [(j.items, j.task_ids, j.item_dependency()[0]) for j in follow] == [
        ((0,), (), None),  # waits on nothing: second[0] is done
        ((1,), (), "afterok:<second[1]>"),
        ((2, 3), (2, 3), "aftercorr:10"),  # tasks 2, 3 of 10: one array at task ids 2 and 3
        ((4,), (), "afterok:12_0")]
    text = follow[2].sbatch_text()
    assert "#SBATCH --array=2-3%1" in text and "#SBATCH --dependency=aftercorr:10" in text
    assert "stage follow (array 3 of 4): items [2, 3] (task ids 2-3) 1 rank(s) per job after second[k] for " \
           "each item k (aftercorr on job 10)" in p.summary()
    # items at tasks 0..n-1 of one queued array make one array again, numbered as submitit does
    queued = {("second", k): f"10_{k}" for k in range(3)}
    p = make(finished={("first", None)}, queued=queued)
    assert [(j.items, j.task_ids, j.item_dependency()[0]) for j in p.jobs] == [((0, 1, 2), (), "aftercorr:10")]


def test_a_partial_resubmission_of_500_items_is_one_array():
    # items 500 to 999 of `second` ran again (array 20, task ids 0..499); follow's 500 to 999 wait on
    # them, and follow's 0 to 499 on the tasks still queued at ids 0..499 of the first array, 10
    parts = list(range(1000))
    queued = {("second", k): f"10_{k}" for k in range(500)}
    done = {("first", None)} | {("second", k) for k in range(500, 1000)}
    p = make(f"tiny.parts={parts}", finished=done, queued=queued, max_size=1001)
    assert [(j.label, len(j.items), j.item_dependency()[0]) for j in p.jobs] == [
        ("follow#1", 500, "aftercorr:10"), ("follow#2", 500, None)]
    # only its items 500 to 999, whose upstream tasks sit at ids 500..999 of array 10
    queued = {("second", k): f"10_{k}" for k in range(500, 1000)}
    p = make(f"tiny.parts={parts}", finished={("first", None)} | {("follow", k) for k in range(500)},
             queued=queued, max_size=1001)
    (follow,) = [j for j in p.jobs if j.stage == "follow"]
    assert follow.task_ids == tuple(range(500, 1000)) and follow.item_dependency()[0] == "aftercorr:10"
    assert "#SBATCH --array=500-999%256" in follow.sbatch_text()


def test_arrays_split_at_max_array_size_keep_their_dependencies():
    p = make("tiny.parts=[0,1,2,3,4]", "tiny.third=true", max_size=2)
    jobs = by_label(p)
    assert [(j.label, j.items) for j in p.jobs if j.stage in ("second", "follow")] == [
        ("second#1", (0, 1)), ("second#2", (2, 3)), ("second#3", (4,)),
        ("follow#1", (0, 1)), ("follow#2", (2, 3)), ("follow#3", (4,))]
    assert jobs["third"].after == ("second",)  # all of its arrays: submit_plan collects them by stage
    assert any("5 items, more than the cluster's MaxArraySize 2: submitted as 3 arrays" in n for n in p.notes)
    assert "stage second (array 2 of 3): items [2, 3]" in p.summary()
    ids = {"second#1": ["1_0", "1_1"], "second#2": ["2_0", "2_1"], "second#3": ["3"]}
    assert [jobs[f"follow#{k}"].item_dependency(ids)[0] for k in (1, 2, 3)] == [
        "aftercorr:1", "aftercorr:2", "afterok:3"]
    assert "#SBATCH --dependency='aftercorr:<second#2>'" in jobs["follow#2"].sbatch_text()
    assert "#SBATCH --array=0-1%2" in jobs["second#2"].sbatch_text()


def test_without_a_max_array_size_nothing_is_split():
    assert [j.label for j in make("tiny.parts=[0,1,2,3,4]").jobs] == ["first", "second", "follow"]


def test_local_executor_runs_the_stage_after_the_whole_upstream():
    p = make(kind="local")
    assert "stage follow: items [0, 1, 2] 1 rank(s) per job after second (submitted when it has ended)" in p.summary()
    done = {("first", None), *(("second", i) for i in range(3))}
    assert "stage follow: items [0, 1, 2] 1 rank(s) per job\n" in make(kind="local", finished=done).summary()


def test_parts_pure():
    now = {0: ("a", 0), 1: ("a", 1), 2: None, 3: None, 4: None}
    assert arrays.parts((0, 1, 2, 3, 4), now, max_size=2) == [
        arrays.Part((0, 1), (("a", 0), ("a", 1))), arrays.Part((2, 3), (None, None)), arrays.Part((4,), (None,))]
    # another order than the upstream's: reordered to its task ids
    assert arrays.parts((1, 0), now) == [arrays.Part((0, 1), (("a", 0), ("a", 1)))]
    # task ids past the cluster's MaxArraySize (it shrank since): one job each
    assert len(arrays.parts((0, 1), now, max_size=1)) == 2
    assert arrays.chunks((), 3) == [] and arrays.chunks((1, 2, 3), None) == [(1, 2, 3)]
    # several items on one task (a sweep point's items after its one task): one array per item
    on = {"p0": ("a", 0), "q0": ("a", 0), "p1": ("a", 1), "q1": ("a", 1), "r1": ("a", 1)}
    assert [(p.items, p.task_ids) for p in arrays.parts(list(on), on)] == [
        (("p0", "p1"), (0, 1)), (("q0", "q1"), (0, 1)), (("r1",), (0,))]


def test_spec_renders_runs_and_the_throttle():
    assert arrays.spec((3, 7, 12, 13, 14, 15, 16, 17, 18, 19, 20), 4) == "3,7,12-20%4"
    assert arrays.spec(range(500, 1000)) == "500-999%256"  # submitit's default throttle
    assert arrays.spec((5,), 8) == "5%1"
    assert arrays.task_ids("3,7,12-20%4") == [3, 7, *range(12, 21)] and arrays.task_ids("0-6:3") == [0, 3, 6]


@settings(max_examples=200, deadline=None)
@given(st.sets(st.integers(0, 2999), max_size=400), st.sets(st.integers(0, 2999), max_size=60),
       st.integers(1, 1001), st.integers(1, 300))
def test_any_subset_keeps_each_item_at_its_upstream_task_id(upstream, done, max_size, parallelism):
    """Whatever subset of an upstream array's items runs again: every item sits at its own task's id
    in an array waiting (aftercorr) on that one array, ids below MaxArraySize, --array lists them."""
    todo = sorted(upstream | done)
    where = {i: (None if i in done else f"10_{i}") for i in todo}
    out = arrays.parts(todo, where, max_size)
    assert sorted(i for p in out for i in p.items) == todo
    assert len([p for p in out if p.waits[0] is None]) == len(arrays.chunks(sorted(done), max_size))
    for p in out:
        assert len(p.items) <= max_size and len(set(p.task_ids)) == len(p.items)
        if p.waits[0] is None:
            continue
        assert all(w == f"10_{i}" for i, w in zip(p.items, p.waits))
        if len(p.items) > 1:  # one array at the upstream ids, which the rendered --array lists
            assert list(p.task_ids) == sorted(p.items) and max(p.task_ids) < max_size
            assert arrays.task_ids(arrays.spec(p.task_ids, parallelism)) == list(p.task_ids)
            assert arrays.dependency(p, "a")[0] == "aftercorr:10"
    below = [i for i in upstream - done if i < max_size]
    assert sum(len(p.items) > 1 for p in out if p.waits[0]) == (len(below) > 1)  # one array for all of them
    assert sum(len(p.items) for p in out if len(p.items) == 1 and p.waits[0]) == len(upstream - done) - (
        len(below) if len(below) > 1 else 0)


@pytest.mark.parametrize("stages, why", [
    ([("a", (0, 1), ""), ("b", (0, 1), "c")], "per_item_after='c'"),  # not an earlier stage
    ([("a", (0,), ""), ("b", (0, 1), "a")], "with items [0, 1]"),  # item 1 is not one of a's
    ([("a", (), ""), ("b", (0,), "a")], "expected an earlier array stage"),
])
def test_bad_per_item_declarations_are_refused(stages, why):
    from omegaconf import OmegaConf

    from tests.test_plan_stages import Cfg

    defs = [plan.StageDef(n, "m:f", items=items, per_item_after=up) for n, items, up in stages]
    pipe = plan.PipelineDef("t", Cfg, lambda cfg: defs)
    with pytest.raises(config.ConfigError, match="HINT: fix the pipeline") as err:
        plan.make_plan(pipe, OmegaConf.structured(Cfg), "/r", "slurm")
    assert why in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("value", ["0", "-3"])
def test_array_parallelism_below_one_is_refused(value):
    with pytest.raises(config.ConfigError, match=f"stages.second.array_parallelism={value}; expected an integer "
                                                 ">= 1 .* HINT: set stages.second.array_parallelism=8"):
        make(f"stages.second.array_parallelism={value}")


def test_array_parallelism_throttles_the_array():
    text = by_label(make("tiny.parts=[0,1,2,3,4]", "stages.second.array_parallelism=2"))["second"].sbatch_text()
    assert "#SBATCH --array=0-4%2" in text


def test_max_array_size_is_read_from_scontrol_show_config():
    text = "Configuration data as of ...\nMailProg                = /bin/mail\nMaxArraySize            = 4\n"
    assert scheduler.parse_max_array_size(text) == 4
    assert scheduler.parse_max_array_size("MaxArraySize = 0\n") == 1  # arrays disabled: one task each
    assert scheduler.parse_max_array_size("") == 1001  # SLURM's default


def test_each_task_records_the_one_task_it_waits_for(tmp_path):
    run = RunDir(tmp_path)
    run.start("tiny", "{}", "slurm")
    run.record_all("follow", [(0, "11_0"), (1, "11_1")], "slurm", ["5"], [["10_0"], ["10_1"]])
    assert run.dependencies() == {"11_0": ["5", "10_0"], "11_1": ["5", "10_1"]}
