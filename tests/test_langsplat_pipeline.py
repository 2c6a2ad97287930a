"""The LangSplat pipeline definition in synthetic mode (external mode: test_langsplat_external.py),
and the checks of its trainer's settings at submission."""
import subprocess
import sys

import pytest
from hypothesis import given, settings, strategies as st

from hpc import submit
from hpc.config import schema as config
from hpc.jobs.langsplat import defaults
from hpc.jobs.langsplat import pipeline as lp
from hpc.pipeline import plan
from tests.test_cli_errors import one_line_error


@pytest.fixture(autouse=True)
def own_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("HPC_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))


def load(*overrides):
    pipe = plan.get_pipeline("langsplat")
    cfg = config.load(pipe.schema, "langsplat", None, list(overrides), extra=pipe.templates, settle=pipe.settle)
    pipe.validate(cfg)
    return cfg


def dry(tmp_path, *overrides):
    return submit.main(["langsplat", "--cluster", "local", "--dry-run", "--run-dir", str(tmp_path / "r"), *overrides])


def test_stages_rgb_then_one_features_task_per_level():
    cfg = load("langsplat.levels=[2,0]")
    rgb, features = lp.stages(cfg)
    assert (rgb.name, rgb.items, rgb.target) == ("rgb", (), "hpc.jobs.langsplat.pipeline:rgb")
    assert (features.items, features.after) == ((2, 0), ("rgb",))


def test_the_config_holds_every_trainer_setting_the_trainer_runs_with():
    cfg = load("langsplat.trainer.seed=3", "langsplat.trainer.rgb_lr.means=0.002")
    trainer = config.to_dict(cfg.langsplat.trainer)
    assert trainer == {**defaults.TRAINER, "cameras_per_step": 8, "seed": 3,  # 8: templates/langsplat.yaml
                       "rgb_lr": {**defaults.TRAINER["rgb_lr"], "means": 0.002}}
    assert defaults.trainer_config(config.to_dict(cfg.langsplat)) == trainer


def test_a_misspelt_trainer_key_is_one_line_naming_the_close_keys(tmp_path, capsys):
    line = one_line_error(dry(tmp_path, "langsplat.trainer.lr=fast"), capsys, "'langsplat.trainer.lr'")
    assert "the closest are ['feature_lr', 'rgb_lr']" in line
    one_line_error(dry(tmp_path, "langsplat.trainer.feature_lrr=0.1"), capsys, "the closest are ['feature_lr',")
    one_line_error(dry(tmp_path, "langsplat.trainer.rgb_lr.mean=0.1"), capsys, "the closest are ['means']")
    out = subprocess.run([sys.executable, "-m", "hpc.submit", "langsplat", "--cluster", "local", "--dry-run",
                          "langsplat.trainer.lr=fast"], capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stderr


@pytest.mark.parametrize("override, words", [
    ("feature_lr=fast", ["langsplat.trainer.feature_lr", "'fast'", "Float"]),
    ("feature_iterations=-5", ["langsplat.trainer.feature_iterations=-5", "an integer >= 1"]),
    ("feature_iterations=2.5", ["langsplat.trainer.feature_iterations", "'2.5'", "Integer"]),
    ("seed=[1,2]", ["langsplat.trainer.seed", "Integer"]),
    ("feature_lr=0", ["langsplat.trainer.feature_lr=0.0", "a number above 0"]),
    ("rgb_lr.opacity=-0.1", ["langsplat.trainer.rgb_lr.opacity=-0.1", "a number above 0"]),
    ("rgb_lr=3", ["langsplat.trainer.rgb_lr=3", "a section of keys", "means"]),
    ("test_every=1", ["langsplat.trainer.test_every=1", "every view"]),
    ("fov_deg=180", ["langsplat.trainer.fov_deg=180.0", "between 0 and 180"]),
    ("prune_opacity=1", ["langsplat.trainer.prune_opacity=1.0", "not including, 1"]),
    ("cameras_per_step=0", ["langsplat.trainer.cameras_per_step=0", "an integer >= 1"]),
])
def test_a_bad_trainer_value_is_refused_at_submission_in_one_line(tmp_path, capsys, override, words):
    one_line_error(dry(tmp_path, f"langsplat.trainer.{override}"), capsys, *words)


INTEGERS = sorted(k for k, v in defaults.TRAINER.items() if isinstance(v, int))
FLOATS = sorted(k for k, v in defaults.TRAINER.items() if isinstance(v, float))


@settings(max_examples=10, deadline=None)
@given(key=st.sampled_from(INTEGERS + FLOATS),
       text=st.text(alphabet="abcxyz_", min_size=1, max_size=6).filter(lambda t: t not in ("null", "true")))
def test_a_word_for_a_number_is_refused_naming_the_key(key, text):
    """Through the config's load: OmegaConf checks the type the schema declares."""
    with pytest.raises(config.ConfigError, match=rf"langsplat\.trainer\.{key}\b.*'{text}'.*HINT"):
        load(f"langsplat.trainer.{key}={text}")


COUNTS = [k for k, (_, what) in defaults.RULES.items() if what == defaults.COUNT[1]]


@given(key=st.sampled_from(COUNTS), value=st.integers(max_value=0))
def test_a_count_below_one_is_refused_naming_the_key_and_value(key, value):
    with pytest.raises(config.ConfigError, match=rf"^langsplat\.trainer\.{key}={value}; expected an integer >= 1\."):
        defaults.check(defaults.trainer_config({"trainer": {key: value}}))


@given(key=st.sampled_from(FLOATS), value=st.floats(min_value=0.01, max_value=0.99))
def test_a_value_in_every_range_is_taken(key, value):
    defaults.check(defaults.trainer_config({"trainer": {key: value}}))
