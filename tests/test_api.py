"""The Python API without a cluster: hpc.submit -> hpc.Run, typed errors, the short form, import cost.

    python -m pytest tests/test_api.py

The debug executor runs every task in this process, so a whole run takes milliseconds; the same
calls on the real local SLURM cluster are in tests/slurm/test_api_cluster.py.
"""
import dataclasses
import json
import subprocess
import sys

import pytest

import hpc
from hpc import status as status_cmd
from hpc.pipeline.executor import StageContext

ROOT = __import__("pathlib").Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _no_cluster(monkeypatch):
    monkeypatch.delenv("SLURM_CONF", raising=False)
    monkeypatch.chdir(ROOT)  # the stage functions are imported from here (tests.tiny_pipeline, this file)


def test_submit_returns_a_run_whose_status_is_the_commands_json(tmp_path, capsys):
    run = hpc.submit("tests.tiny_pipeline", cluster="debug", run_dir=tmp_path / "run", overrides=["tiny.parts=[0,1]",
                     "tiny.score=0.5"])
    assert isinstance(run, hpc.Run) and run.path == (tmp_path / "run").resolve()
    rows = run.wait(timeout=30)
    assert [(r["task"], r["state"]) for r in rows] == [("first", "COMPLETED"), ("second[0]", "COMPLETED"),
                                                         ("second[1]", "COMPLETED")]
    capsys.readouterr()
    assert status_cmd.main([str(run.path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == hpc.Run.attach(run.path).status() == rows
    assert run.metrics() == {"second[0]": {"score": 0.5}, "second[1]": {"score": 0.5}}
    assert run.outputs()["second[1]"] == [run.path / "second" / "task-1" / "metrics.json",
                                          run.path / "second" / "task-1" / "out-1.txt"]
    assert run.done() and run.cancel() == []  # nothing of a debug run is in any queue


def test_a_bad_override_raises_config_error_and_the_interpreter_goes_on(tmp_path):
    for bad in (dict(overrides=["tiny.nope=1"]), dict(overrides="tiny.parts=[0]"), dict(nodez="2")):
        with pytest.raises(hpc.ConfigError) as err:
            hpc.submit("tests.tiny_pipeline", cluster="debug", run_dir=tmp_path / "run", **bad)
        assert "HINT" in str(err.value)
    assert not (tmp_path / "run").exists()
    run = hpc.submit("tests.tiny_pipeline", cluster="debug", run_dir=tmp_path / "run", overrides=["tiny.parts=[0]"])
    assert run.done()


def test_attach_refuses_what_is_no_run_and_names_a_sweep_a_sweep(tmp_path):
    with pytest.raises(hpc.RunDirError, match="manifest.json not found"):
        hpc.Run.attach(tmp_path)
    sweep = hpc.submit("tests.tiny_pipeline", cluster="debug", run_dir=tmp_path / "sweep",
                       overrides=["tiny.parts=[0]"], sweep=["tiny.score=1,2"])
    assert isinstance(hpc.Run.attach(sweep.path), hpc.Sweep)
    assert sorted(r["state"] for r in sweep.status()) == ["COMPLETED", "COMPLETED"]
    assert sorted(p.metrics()["second[0]"]["score"] for p in sweep.points().values()) == [1, 2]


def test_import_hpc_loads_none_of_the_api_until_it_is_used():
    probe = ("import sys, hpc; loaded = [m for m in ('hpc.api', 'hpc.runs', 'hpc.submit', 'omegaconf', 'yaml') "
             "if m in sys.modules]; assert not loaded, loaded; hpc.Run; assert 'hpc.runs' in sys.modules; "
             "assert callable(hpc.submit) and hpc.submit.main")
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


# The short form: a pipeline of plain functions, defined here and submitted as it is.
def shard(ctx: StageContext) -> dict:
    (ctx.stage_dir / "shard.txt").write_text(str(ctx.item))
    return {"item": ctx.item}


def merge(ctx: StageContext) -> list:  # the README's merge: its value is what run.result("merge") gives
    found = sorted((ctx.run_dir / "shard").glob("task-*/shard.txt"))
    (ctx.stage_dir / "merged.txt").write_text(" ".join(p.read_text() for p in found))
    return [p.read_text() for p in found]


SHORT = hpc.define("short", hpc.stage(shard, items=[0, 1, 2], cpus_per_task=1, time_min=5),
                   hpc.stage(merge, after=[shard], cpus_per_task=1, time_min=5))


def test_a_short_form_pipeline_plans_runs_and_takes_overrides(tmp_path, capsys):
    run = hpc.submit(SHORT, cluster="debug", run_dir=tmp_path / "run", overrides=["stages.merge.time_min=7"])
    assert run.done()
    assert (run.path / "merge" / "merged.txt").read_text() == "0 1 2"
    config = (run.path / "config.yaml").read_text()
    assert "time_min: 7" in config and "time_min: 5" in config and "cpus_per_task: 1" in config
    manifest = json.loads((run.path / "manifest.json").read_text())
    assert manifest["pipeline_arg"] == f"{__name__}:SHORT"  # how a job finds it again
    with pytest.raises(hpc.ConfigError, match="unknown resource 'gpus'.*gpus_per_node"):
        hpc.stage(shard, gpus=1)
    with pytest.raises(hpc.ConfigError, match="waits on"):
        hpc.define("bad", hpc.stage(merge, after=[shard]))
    with pytest.raises(hpc.ConfigError, match="not a top-level function"):
        hpc.stage(lambda ctx: None)


@dataclasses.dataclass
class TunedSettings:
    scale: int = 1  # what each task multiplies its item by
    count: int = 2  # the stage's items: 0 .. count-1


def scaled(ctx: StageContext) -> int:
    value = ctx.item * ctx.cfg["tuned"]["scale"]
    (ctx.stage_dir / "metrics.json").write_text(json.dumps({"value": value}))
    return value


TUNED = hpc.define("tuned", hpc.stage(scaled, items=lambda cfg: list(range(cfg.tuned.count)), cpus_per_task=1),
                   config=TunedSettings)


def test_a_short_form_pipeline_with_settings_of_its_own_is_swept(tmp_path):
    sweep = hpc.submit(TUNED, cluster="debug", run_dir=tmp_path / "sweep", overrides=["tuned.count=3"],
                       sweep=["tuned.scale=10,100"])
    got = {p["overrides"]["tuned.scale"]: p["tasks"] for p in sweep.wait(timeout=30)}
    assert got == {10: "3/3", 100: "3/3"}
    for point in sweep.points().values():
        scale = point.result("scaled", 2) // 2
        assert (point.path / "config.yaml").read_text().count(f"scale: {scale}") == 1
    with pytest.raises(hpc.ConfigError, match="expected a dataclass"):
        hpc.define("bad", hpc.stage(scaled), config=TunedSettings())
    with pytest.raises(hpc.ConfigError, match="expected a Python identifier"):
        hpc.define("my-pipe", hpc.stage(scaled), config=TunedSettings)


def test_result_gives_what_a_stage_function_returned_and_says_why_not(tmp_path):
    run = hpc.submit(SHORT, cluster="debug", run_dir=tmp_path / "run")
    assert run.result("merge") == ["0", "1", "2"] and run.result("shard", 1) == {"item": 1}
    for args, why in ((("merge", 0), "stage 'merge' has no task 0; expected item= one of its items \\[None\\]"),
                      (("shard",), "stage 'shard' has 3 tasks, one per item; expected item= one of .*0, 1, 2"),
                      (("shards",), "stage 'shards' not in .*; expected one of \\['merge', 'shard'\\]")):
        with pytest.raises(ValueError, match=why):
            run.result(*args)
    failed = hpc.submit("tests.tiny_pipeline", cluster="debug", run_dir=tmp_path / "failed",
                        overrides=["tiny.parts=[0,1]", "tiny.fail_items=[1]"])
    assert failed.result("second", 0) == {"item": 0}
    with pytest.raises(hpc.ResultError, match=r"second\[1\] has no result: it is UNKNOWN.*HINT") as err:
        failed.result("second", 1)
    assert err.value.state == "UNKNOWN"  # the debug executor leaves no record of a failure


def test_run_and_sweep_refuse_a_path_that_is_not_theirs_and_logs_names_the_ranks(tmp_path):
    with pytest.raises(hpc.RunDirError, match="typo/manifest.json not found; expected a run directory.*HINT"):
        hpc.Run(tmp_path / "typo").wait()
    run = hpc.submit(SHORT, cluster="debug", run_dir=tmp_path / "run")
    sweep = hpc.submit(TUNED, cluster="debug", run_dir=tmp_path / "sweep", sweep=["tuned.scale=2"])
    with pytest.raises(hpc.RunDirError, match="sweep.json not found; expected a sweep.*HINT: it is a run directory: "
                       "hpc.Run"):
        hpc.Sweep(run.path)
    with pytest.raises(hpc.RunDirError, match="manifest.json not found.*HINT: it is a sweep directory: hpc.Sweep"):
        hpc.Run(sweep.path)
    assert run.logs("shard", 1, rank=0) == run.log_paths("shard", 1)[0].read_text() != ""
    with pytest.raises(ValueError, match=r"rank 5 of job .* has no log .*ranks that logged: \[0\]. HINT"):
        run.logs("shard", 1, rank=5)
    with pytest.raises(ValueError, match=r"task '7' not found; expected one of \['0', '1', '2'\]"):
        run.logs("shard", 7)
    with pytest.raises(ValueError, match=r"stage 'shards' not in this run; expected one of \['merge', 'shard'\]"):
        run.logs("shards")


def test_a_sweep_gives_each_points_logs_metrics_outputs_and_results(tmp_path):
    sweep = hpc.Run.attach(hpc.submit(TUNED, cluster="debug", run_dir=tmp_path / "sweep",
                                      sweep=["tuned.scale=10,100"]).path)
    by_scale = {r["overrides"]["tuned.scale"]: r["point"] for r in sweep.status()}
    assert sweep.result(by_scale[10], "scaled", 1) == 10 and sweep.result({"tuned.scale": 100}, "scaled", 1) == 100
    assert sweep.metrics() == {by_scale[s]: {"scaled[0]": {"value": 0}, "scaled[1]": {"value": s}} for s in (10, 100)}
    outputs = sweep.outputs()[by_scale[10]]
    assert outputs["scaled[1]"] == [sweep.path / by_scale[10] / "scaled" / "task-1" / "metrics.json"]
    log = sweep.point(by_scale[100]).log_paths("scaled", 1)[0]
    assert sweep.logs({"tuned.scale": 100}, "scaled", 1) == log.read_text() != ""
    with pytest.raises(hpc.RunDirError, match=r"point 'nope' not in sweep .*tuned.scale=10.*HINT"):
        sweep.logs("nope", "scaled", 1)


def test_the_readme_example_runs_as_a_script(tmp_path):
    """The README's demo.py, run as `python demo.py`: its stage functions are `__main__`'s, which
    the jobs import as the module `demo`; without SLURM it runs on the local executor."""
    text = (ROOT / "README.md").read_text()
    start = text.index("# demo.py")
    (tmp_path / "demo.py").write_text(text[start:text.index("```", start)])
    env = {**__import__("os").environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    env.pop("SLURM_CONF", None)
    out = subprocess.run([sys.executable, "demo.py"], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "['COMPLETED', 'COMPLETED', 'COMPLETED', 'COMPLETED']" in out.stdout, out.stdout[-2000:]
    assert "part.txt" in out.stdout and "[hpc] stage merge" in out.stdout
    assert "['COMPLETED', 'COMPLETED', 'COMPLETED', 'COMPLETED'] ['part 0', 'part 1', 'part 2']" in out.stdout
    (run_dir,) = [p for p in (tmp_path / "runs").iterdir() if p.name != ".hpc-snapshots"]  # the root's code store beside it
    assert json.loads((run_dir / "manifest.json").read_text())["pipeline_arg"] == "demo:PIPE"


def test_an_error_of_hpc_s_own_is_raised_as_itself_not_as_the_schedulers(tmp_path, monkeypatch):
    from hpc.rundir import codefiles

    monkeypatch.setattr(codefiles, "GIT_FILES", ["git", "ls-files", "--no-such-option"])  # git refuses
    with pytest.raises(codefiles.SnapshotError) as err:  # the local executor snapshots the code first
        hpc.submit("tests.tiny_pipeline", cluster="local", run_dir=tmp_path / "run", overrides=["tiny.parts=[0]"])
    assert "scheduler" not in str(err.value) and str(err.value).count("HINT") == 1
