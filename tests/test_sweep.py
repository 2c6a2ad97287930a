"""Sweeps without a scheduler: the command line, the plan of a sweep's arrays (dry run), what a
resubmission skips, and the one-line errors. The sweep on SLURM is tests/slurm/test_sweep.py.

    python -m pytest tests/test_sweep.py -q
"""
import json

import pytest
import yaml

from hpc.config import schema as hconfig
from hpc.sweep import grid, launch, submission as sweep, points as sweepconfig
from hpc.pipeline import plan
from hpc import submit
from hpc.pipeline import submission
from hpc.rundir import sweepdir
from hpc.rundir.run import RunDir
from tests.test_cli_errors import one_line_error

SLURM = ["--cluster", "slurm", "cluster.partitions=[low]"]  # partitions given: no sinfo call


@pytest.fixture(autouse=True)
def tiny(monkeypatch):
    monkeypatch.setitem(plan.PIPELINES, "tiny", "tests.tiny_pipeline")


def test_tokens_after_sweep_are_axes_and_the_others_overrides():
    args = submit.parse_args(["tiny", "tiny.sleep_s=1", "--sweep", "tiny.score=1,2", "tiny.parts=[0,1],[2]",
                              "--dry-run", "tiny.third=true", "--sweep-file", "g.yaml"])
    assert args.sweep == ("tiny.score=1,2", "tiny.parts=[0,1],[2]")
    assert args.overrides == ("tiny.sleep_s=1", "tiny.third=true")
    assert args.dry_run and args.sweep_file == "g.yaml"
    assert submit.parse_args(["tiny"]).sweep is None


def test_dry_run_plans_one_array_per_stage_across_the_points(tmp_path, capsys):
    code = submit.main(["tiny", *SLURM, "--dry-run", "--run-dir", str(tmp_path / "s"), "tiny.parts=[0,1,2]",
                        "--sweep", "tiny.score=1,2", "tiny.sleep_s=0,1"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "stage first: one array of 4 task(s) over 4 point(s)" in out
    # each point's 3 items wait on its one `first` task: task k of each array on task k of first's
    for k in (1, 2, 3):
        assert f"stage second#{k}: one array of 4 task(s) over 4 point(s), 1 rank(s) per task, after its own " \
               "point's first task, task by task (aftercorr)" in out
    assert "stage second: 3 arrays, as several of its tasks wait on one first task" in out
    assert out.count("#SBATCH --array=0-3%4") == 4 and "afterany" not in out
    assert out.count("--dependency='aftercorr:<first>'") == 3
    for p in grid.points({"tiny.score": [1, 2], "tiny.sleep_s": [0, 1]}):
        assert f"point {p.signature} {p.describe()}: new" in out
    assert not (tmp_path / "s").exists()  # a dry run writes nothing


def test_a_grid_file_stands_in_for_the_flags(tmp_path, capsys):
    path = tmp_path / "grid.yaml"
    path.write_text("tiny.score: [1, 2]\ntiny.sleep_s: [0, 0.5]\n")
    code = submit.main(["tiny", *SLURM, "--dry-run", "--run-dir", str(tmp_path / "s"), "--sweep-file", str(path)])
    out = capsys.readouterr().out
    assert code == 0, out
    for p in grid.points({"tiny.score": [1, 2], "tiny.sleep_s": [0, 0.5]}):
        assert f"point {p.signature} {p.describe()}: new" in out


def test_a_per_item_stage_waits_task_by_task_across_the_points(tmp_path, capsys):
    code = submit.main(["tiny", *SLURM, "--dry-run", "--run-dir", str(tmp_path / "s"), "tiny.follow=true",
                        "tiny.parts=[0,1]", "--sweep", "tiny.score=1,2"])
    out = capsys.readouterr().out
    assert code == 0, out
    for k in (1, 2):  # second is two arrays (one per item of a point after its first task): so is follow
        assert f"stage follow#{k}: one array of 2 task(s) over 2 point(s), 1 rank(s) per task, after its own " \
               "point's second task, task by task (aftercorr)" in out
        assert f"--dependency='aftercorr:<second#{k}>'" in out


def _done(run, stage, item=None):
    run.mark_done(stage, item, {"world_size": 1})


def test_resubmission_skips_done_points_resumes_the_others_and_reports_removed_ones(tmp_path, capsys):
    s = sweepdir.SweepDir(tmp_path / "s")
    old = grid.points({"tiny.score": [1, 2, 3]})
    s.save("tiny", {"tiny.score": [1, 2, 3]}, ["tiny.parts=[0,1]", "cluster.kind=local"], None, old)
    a, b, c = (s.point(p.signature) for p in old)
    for stage, item in [("first", None), ("second", 0), ("second", 1)]:
        _done(a, stage, item)
    _done(b, "first")
    code = submit.main(["tiny", "--dry-run", "--run-dir", str(s.path), "--sweep", "tiny.score=1,2,4"])
    out = capsys.readouterr().out
    assert code == 0, out
    new = grid.points({"tiny.score": [4]})[0]
    assert f"point {old[0].signature} tiny.score=1: done" in out
    assert f"point {old[1].signature} tiny.score=2: resume: 2 of 3 task(s) to submit, 1 done" in out
    assert f"point {new.signature} tiny.score=4: new: 3 of 3" in out
    assert f"point {old[2].signature} (tiny.score=3) is no longer in the grid" in out
    assert "stage first: one array of 1 task(s) over 1 point(s)" in out  # only the new point's
    assert "stage second: one array of 4 task(s) over 2 point(s)" in out  # tiny.parts=[0,1] was recorded
    assert c.path.name == old[2].signature and not c.path.exists()


def test_the_recorded_grid_is_used_when_none_is_given(tmp_path, capsys):
    s = sweepdir.SweepDir(tmp_path / "s")
    pts = grid.points({"tiny.score": [1, 2]})
    s.save("tiny", {"tiny.score": [1, 2]}, ["cluster.kind=local"], None, pts)
    assert submit.main(["tiny", "--dry-run", "--run-dir", str(s.path)]) == 0
    out = capsys.readouterr().out
    assert all(f"point {p.signature}" in out for p in pts) and "2 point(s)" in out


def test_point_configs_and_stage_items(tmp_path):
    pipe = plan.get_pipeline("tiny")
    base = submission.build(submit.parse_args(["tiny", "--cluster", "local", "--run-dir", str(tmp_path)]), view=False)[1]
    pts = grid.points({"tiny.parts": [[0], [1, 2]], "tiny.score": [0.5]})
    defs = sweepconfig.resolve(base, pts, pipe)
    texts = [hconfig.to_yaml(cfg) for _, cfg in sweepconfig.configs(base, pts)]
    assert [yaml.safe_load(t)["tiny"]["parts"] for t in texts] == [[0], [1, 2]]
    assert base.tiny.score == 0.0 and list(base.tiny.parts) == [0, 1, 2]  # the base is left as it was
    # a whole section as an axis merges into the base's section, and nothing leaks to the next point
    sections = grid.points({"tiny": [{"score": 1.0}, {"sleep_s": 2.0}]})
    assert [(c.tiny.score, c.tiny.sleep_s) for _, c in sweepconfig.configs(base, sections)] == [(1.0, 0.0), (0.0, 2.0)]
    merged = {s.name: s for s in sweep.merged_stages(defs)}
    sig0, sig1 = defs
    assert merged["first"].items == ((sig0, None), (sig1, None))
    assert merged["second"].items == ((sig0, 0), (sig1, 1), (sig1, 2))
    assert launch.afterany([["7_0"], ["7_1", "6"]], {"first": ["7_0", "7_1"]}) == "afterany:6:7"
    assert launch.afterany([["7_0"]], {"first": ["7_0", "7_1"]}) == "afterany:7_0"
    assert sweep.latest(["a=1", "b=2", "a=3"]) == ["b=2", "a=3"]


def test_each_point_waits_on_its_own_points_task_wherever_it_sits(tmp_path):
    # 6 points; the `first` tasks of points 0 to 2 are done, of points 3 and 4 still queued at task ids
    # 7 and 9 of array 40 (a resubmission's), of point 5 submitted now: second waits point by point
    pipe = plan.get_pipeline("tiny")
    base = submission.build(submit.parse_args(["tiny", "--cluster", "slurm", "cluster.partitions=[low]",
                                               "tiny.parts=[0]", "--run-dir", str(tmp_path)]), view=False)[1]
    defs = sweepconfig.resolve(base, grid.points({"tiny.score": list(range(6))}), pipe)
    sigs = list(defs)
    merged = sweep.merged_stages(defs)
    assert [(s.name, s.after, s.per_item_after) for s in merged] == [("first", (), ""), ("second", (), "first")]
    virtual = plan.PipelineDef("tiny", pipe.schema, lambda cfg: merged)
    done = {("first", (sig, None)) for sig in sigs[:3]}
    queued = {("first", (sigs[3], None)): "40_7", ("first", (sigs[4], None)): "40_9"}
    p = plan.make_plan(virtual, base, str(tmp_path), "slurm", frozenset(done), queued, 10)
    assert [(j.label, [sigs.index(s) for s, _ in j.items], j.task_ids, j.after, j.item_dependency()[0])
            for j in p.jobs] == [
        ("first", [5], (), (), None),
        ("second#1", [0, 1, 2], (), (), None),  # their first tasks are done
        ("second#2", [3, 4], (7, 9), (), "aftercorr:40"),  # one array at its points' task ids
        ("second#3", [5], (), (), "afterok:<first[('%s', None)]>" % sigs[5])]
    assert "#SBATCH --array=7,9%2" in p.jobs[2].sbatch_text()
    # a stage after a stage of several tasks per point waits for the whole arrays (afterany)
    two = sweepconfig.resolve(base, grid.points({"tiny.parts": [[0, 1]], "tiny.third": [True]}), pipe)
    third = {s.name: s for s in sweep.merged_stages(two)}["third"]
    assert third.after == ("second",) and not third.per_item_after


@pytest.mark.parametrize("pipeline, extra, axes", [
    ("tiny", ["--cluster", "local"], {"tiny.score": [1.5, 2], "tiny.parts": [[0], [1, 2]]}),
    ("tiny", ["--cluster", "local", "run.name=r${tiny.score}"], {"tiny.score": [1.5, 2]}),  # an interpolation
    ("langsplat", ["--profile", "sandbox", "--cluster", "local"], {"langsplat.trainer.cameras_per_step": [1, 2]}),
])
def test_each_points_config_yaml_is_what_to_yaml_writes(tmp_path, pipeline, extra, axes):
    base = submission.build(submit.parse_args([pipeline, *extra, "--run-dir", str(tmp_path)]), view=False)[1]
    pts = grid.points(axes)
    expected = [hconfig.to_yaml(cfg) for _, cfg in sweepconfig.configs(base, pts)]
    assert list(sweepconfig.texts(base, pts).values()) == expected
    assert len(set(expected)) == len(pts)


@pytest.mark.parametrize("axes, words", [
    (["tiny.score"], ["has no '='"]),
    (["tiny.score="], ["empty value"]),
    (["tiny.score=1,,2"], ["empty value"]),
    (["tiny.nope=1,2"], ["unknown config key", "tiny.score"]),
    (["tiny.score=1", "tiny.score=2"], ["given twice"]),
    (["stages.first.nodes=1,2"], ["shared by all points"]),
    (["tiny.score=abc"], ["tiny.score='abc'", "type"]),
    ([], ["no axes"]),
])
def test_bad_sweeps_are_refused_in_one_line(tmp_path, capsys, axes, words):
    code = submit.main(["tiny", "--cluster", "local", "--dry-run", "--run-dir", str(tmp_path / "s"), "--sweep", *axes])
    one_line_error(code, capsys, *words)


def test_a_run_dir_is_not_a_sweep_dir(tmp_path, capsys):
    RunDir(tmp_path).start("tiny", "{}\n", "local")
    code = submit.main(["tiny", "--cluster", "local", "--dry-run", "--run-dir", str(tmp_path),
                        "--sweep", "tiny.score=1"])
    one_line_error(code, capsys, "is a run, not a sweep")
    json.loads((tmp_path / "manifest.json").read_text())  # untouched


def test_a_job_of_a_sweep_array_finds_its_point(tmp_path):
    s = sweepdir.SweepDir(tmp_path / "s")
    one, two = grid.points({"tiny.score": [1, 2]})
    s.save("tiny", {"tiny.score": [1, 2]}, [], None, [one, two])
    s.point(two.signature).start("tiny", "{}\n", "slurm")
    s.point(two.signature).record_all("second", [(0, "7_2"), (1, "7_3")], "slurm")
    assert sweepdir.run_for(s.path, "7_3").path == s.point(two.signature).path
    assert sweepdir.run_for(s.path, "8_0").path == s.path  # no point recorded it
    assert sweepdir.run_for(tmp_path / "run", "7_3").path == (tmp_path / "run").resolve()  # not a sweep


def test_a_points_file_names_each_task_by_its_array_task_id(tmp_path):
    """An array at explicit task ids (items resubmitted at their upstream tasks' ids, aftercorr) finds
    each task's point by its id, not by its place in the array."""
    s = sweepdir.SweepDir(tmp_path / "s")
    one, two = grid.points({"tiny.score": [1, 2]})
    s.save("tiny", {"tiny.score": [1, 2]}, [], None, [one, two])
    points = s.write_points("second", [one.signature, two.signature, one.signature], task_ids=[2, 3, 5])
    assert sweepdir.run_for(s.path, "9_3", points).path == s.point(two.signature).path
    assert sweepdir.run_for(s.path, "9_5", points).path == s.point(one.signature).path
    assert sweepdir.run_for(s.path, "9_0", points).path == s.path  # no task 0 in it, none recorded: the scan
    plain = s.write_points("first", [two.signature, one.signature])
    assert sweepdir.run_for(s.path, "8_0", plain).path == s.point(two.signature).path


def test_every_key_a_plain_override_sets_is_a_sweep_axis(tmp_path, capsys):
    """Every key of the LangSplat trainer, spelt out in the template or not, as one axis each."""
    from hpc.jobs.langsplat.defaults import TRAINER

    axes = [f"langsplat.trainer.{key}={json.dumps(_at(TRAINER, key))}" for key in grid.leaf_keys(TRAINER)]
    assert len(axes) > 30
    assert submit.main(["langsplat", "--cluster", "local", "--dry-run", "--run-dir", str(tmp_path / "one"),
                        "--sweep", *axes]) == 0, capsys.readouterr().err
    assert submit.main(["langsplat", "--cluster", "local", "--dry-run", "--run-dir", str(tmp_path / "four"),
                        "--sweep", "langsplat.trainer.seed=1,2", "langsplat.trainer.feature_lr=0.01,0.1"]) == 0
    assert "4 point(s)" in capsys.readouterr().out


def test_a_new_key_of_an_open_mapping_is_a_sweep_axis_as_it_is_an_override(tmp_path, capsys, monkeypatch):
    """A Dict field takes keys the schema does not name, as a key=value override and as an axis."""
    (tmp_path / "openpipe.py").write_text(
        "from dataclasses import dataclass, field\nfrom typing import Any, Dict\n"
        "from hpc.config import PipelineConfig, Resources\nfrom hpc.pipeline import PipelineDef, StageDef\n\n"
        "@dataclass\nclass Stages:\n    main: Resources = field(default_factory=Resources)\n\n"
        "@dataclass\nclass Config(PipelineConfig):\n    stages: Stages = field(default_factory=Stages)\n"
        "    opts: Dict[str, Any] = field(default_factory=dict)\n\n"
        "def stages(cfg):\n    return [StageDef('main', 'openpipe:main')]\n\n"
        "PIPELINE = PipelineDef('openpipe', Config, stages)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(__import__("sys").modules, "openpipe", raising=False)
    base = ["openpipe:PIPELINE", "--cluster", "local", "--dry-run", "--run-dir"]
    assert submit.main([*base, str(tmp_path / "run"), "opts.lr=0.1", "opts.deep.k=1"]) == 0
    assert submit.main([*base, str(tmp_path / "sweep"), "--sweep", "opts.lr=0.1,0.2", "opts.deep.k=1,2"]) == 0
    assert "4 point(s)" in capsys.readouterr().out
    code = submit.main([*base, str(tmp_path / "bad"), "--sweep", "optz.lr=1,2"])  # still refused: a typo
    one_line_error(code, capsys, "unknown config key", "['opts']")


def _at(tree, dotted):
    for part in dotted.split("."):
        tree = tree[part]
    return tree
