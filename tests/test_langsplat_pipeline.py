"""The LangSplat pipeline definition: stages, validation, external-mode command templates."""
import json

import pytest

from hpc import config, plan, submit
from hpc.rundir import RunDir
from hpc.jobs.langsplat import pipeline as lp


def load(*overrides):
    pipe = plan.get_pipeline("langsplat")
    return config.load(pipe.schema, "langsplat", None, list(overrides), extra=pipe.templates)


def test_stages_rgb_then_one_features_task_per_level():
    cfg = load("langsplat.levels=[2,0]")
    rgb, features = lp.stages(cfg)
    assert (rgb.name, rgb.items, rgb.target) == ("rgb", (), "hpc.jobs.langsplat.pipeline:rgb")
    assert (features.items, features.after) == ((2, 0), ("rgb",))


def test_external_templates_become_argv_without_a_shell(tmp_path):
    data = tmp_path / "my data; rm -rf x"
    cfg = config.to_dict(load("langsplat.mode=external", f"langsplat.data_path='{data}'",
                              "external.use_standin=true", "external.iterations=7"))
    argv = lp.render_command(cfg, "features", model=tmp_path / "f", rgb_model=tmp_path / "rgb", level=1)
    assert argv[argv.index("-s") + 1] == str(data)  # one argument, spaces and ';' included
    assert argv[argv.index("--start_checkpoint") + 1] == str(tmp_path / "rgb" / "chkpnt7.pth")
    assert argv[argv.index("--feature_level") + 1] == "1"


def test_external_mode_needs_a_checkout_unless_standin(tmp_path):
    cfg = load("langsplat.mode=external", f"langsplat.data_path={tmp_path}")
    with pytest.raises(config.ConfigError, match="external.langsplat_dir=None has no train.py"):
        lp.validate(cfg)
    lp.validate(load("langsplat.mode=external", f"langsplat.data_path={tmp_path}", "external.use_standin=true"))
    assert lp.stages(cfg)[1].target == "hpc.jobs.langsplat.pipeline:features_external"


def test_external_standin_runs_locally_with_two_ranks(tmp_path, monkeypatch):
    monkeypatch.delenv("SLURM_CONF", raising=False)
    (tmp_path / "data").mkdir()
    run_dir = tmp_path / "run"
    code = submit.main(["langsplat", "--cluster", "local", "--run-dir", str(run_dir), "--levels", "1",
                        "langsplat.mode=external", f"langsplat.data_path={tmp_path / 'data'}",
                        "external.use_standin=true", "external.iterations=5"])
    assert code == 0
    run = RunDir(run_dir)
    assert run.is_done("rgb") and run.is_done("features", 1)
    assert (run_dir / "rgb" / "chkpnt5.pth").is_file()
    ranks = [json.loads((run_dir / "features" / "task-1" / "standin" / f"rank-{r}.json").read_text())
             for r in (0, 1)]
    assert [r["rank_sum"] for r in ranks] == [1, 1]  # both local processes joined one process group
    assert ranks[0]["args"]["feature_level"] == 1
