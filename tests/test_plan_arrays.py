"""Planning arrays: per-item dependencies (aftercorr) between array stages that share their items,
arrays split at the cluster's MaxArraySize, and array_parallelism.

    python -m pytest tests/test_plan_arrays.py
"""
import pytest

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


def test_items_waiting_on_different_arrays_are_submitted_apart():
    # follow[0] failed on its own (second[0] done), second[1] runs again, second[2] and [3] are
    # still queued in the first array (tasks 2 and 3), second[4] in a resubmission's (task 0)
    done = {("first", None), ("second", 0)}
    queued = {("second", 2): "10_2", ("second", 3): "10_3", ("second", 4): "12_0"}
    p = make("tiny.parts=[0,1,2,3,4]", finished=done, queued=queued)
    follow = [j for j in p.jobs if j.stage == "follow"]
    assert [(j.items, j.item_dependency()[0]) for j in follow] == [
        ((0,), None),  # waits on nothing: second[0] is done
        ((1,), "afterok:<second[1]>"),
        ((2,), "afterok:10_2"), ((3,), "afterok:10_3"),  # tasks 2, 3 of 10: no aftercorr from task 0
        ((4,), "afterok:12_0")]
    # items at tasks 0..n-1 of one queued array make one array again
    queued = {("second", k): f"10_{k}" for k in range(3)}
    p = make(finished={("first", None)}, queued=queued)
    assert [(j.items, j.item_dependency()[0]) for j in p.jobs] == [((0, 1, 2), "aftercorr:10")]


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
    # more items at tasks 0..n-1 than an array may hold: one job each
    assert len(arrays.parts((0, 1), now, max_size=1)) == 2
    assert arrays.chunks((), 3) == [] and arrays.chunks((1, 2, 3), None) == [(1, 2, 3)]


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
