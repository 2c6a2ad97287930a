"""The short form's names (hpc.stage, hpc.define): a stage's name is its config key stages.<name>,
a pipeline's names its run directories; a name that cannot be either is refused in one line.
pytest tests/test_short.py"""
import os
import subprocess
import sys
from pathlib import Path

import pytest

import hpc

ROOT = Path(__file__).resolve().parent.parent


def shard(ctx):
    """A stage."""


@pytest.mark.parametrize("name, hint", [("a.b", "name='a_b'"), ("a/b", "name='a_b'"), ("class", "name='class_'"),
                                        ("1st", "name='s_1st'"), (" ", "name='stage'"), ("a-b", "name='a_b'")])
def test_a_stage_name_that_is_no_identifier_is_refused_with_a_hint(name, hint):
    with pytest.raises(hpc.ConfigError) as err:
        hpc.stage(shard, name=name)
    text = str(err.value)
    assert f"stage name {name!r}" in text and f"HINT: {hint}." in text and "\n" not in text
    assert hpc.stage(shard, name="").name == "shard" and hpc.stage(shard, name="first").name == "first"


@pytest.mark.parametrize("name", ["demo:PIPE", "a/b", "", "my pipe", ".hidden"])
def test_a_pipeline_name_that_cannot_name_a_run_directory_is_refused(name):
    with pytest.raises(hpc.ConfigError, match=r"pipeline name .*; expected letters, digits.*HINT: hpc.define"):
        hpc.define(name, hpc.stage(shard))
    assert hpc.define("demo-2.b_c", hpc.stage(shard)).name == "demo-2.b_c"


def test_a_module_with_a_bad_stage_name_says_so_in_one_line(tmp_path):
    """The module's other pipelines cannot load either: the submission says why in one line, the
    dry run alike, with no traceback."""
    (tmp_path / "mystages.py").write_text(
        "import hpc\n\n\ndef prep(ctx):\n    pass\n\n\n"
        "GOOD = hpc.define('good', hpc.stage(prep))\n"
        "BAD = hpc.define('bad', hpc.stage(prep, name='prep.v2'))\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HPC_CACHE_DIR": str(tmp_path / "cache")}
    for argv in (["--dry-run"], []):
        out = subprocess.run([sys.executable, "-m", "hpc.submit", "mystages:GOOD", "--cluster", "local", *argv],
                             cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
        assert out.returncode == 2, out.stderr
        assert out.stderr.count("\n") == 1 and "Traceback" not in out.stderr, out.stderr
        assert "stage name 'prep.v2'" in out.stderr and "HINT: name='prep_v2'." in out.stderr
