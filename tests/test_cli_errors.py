"""User errors at the command line: one line on stderr (what was seen, what is expected, a HINT),
exit code 2, never a traceback. Run directories, YAML files, profiles, manifests, resource limits.

    python -m pytest tests/test_cli_errors.py -q
"""
import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hpc.config import schema as config
from hpc import cancel, logs, status, submit
from hpc.pipeline import plan
from hpc.rundir.run import RunDir
from hpc.rundir.sweepdir import SweepDir
from hpc.sweep import grid

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def tiny(monkeypatch):
    monkeypatch.setitem(plan.PIPELINES, "tiny", "tests.tiny_pipeline")


def one_line_error(code, capsys, *expect):
    """The command failed with exit code 2 and said exactly one line, naming each of `expect`."""
    err = capsys.readouterr().err
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "HINT" in lines[0], err
    for word in expect:
        assert word in lines[0], (word, lines[0])
    return lines[0]


def dry(run_dir, *args):
    return submit.main(["tiny", "--cluster", "local", "--dry-run", "--run-dir", str(run_dir), *args])


@contextlib.contextmanager
def read_only_dir(tmp_path):
    """A directory this process cannot write to. As root, permissions do not stop writes: a
    read-only tmpfs does."""
    path = tmp_path / "ro"
    path.mkdir()
    if os.geteuid() != 0:
        path.chmod(0o555)
        try:
            yield path
        finally:
            path.chmod(0o755)
        return
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(path)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"running as root and cannot mount a read-only tmpfs: {mounted.stderr.decode().strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", str(path)], check=True)


def test_run_dir_that_is_a_file_or_under_a_file(tmp_path, capsys):
    afile = tmp_path / "afile"
    afile.write_text("x")
    one_line_error(dry(afile), capsys, "is a file")
    one_line_error(dry(afile / "run"), capsys, "sits under", str(afile))
    one_line_error(submit.main(["tiny", "--cluster", "local", "--run-dir", str(afile / "run")]), capsys, "sits under")


def test_read_only_run_dir(tmp_path, capsys):
    with read_only_dir(tmp_path) as ro:
        one_line_error(submit.main(["tiny", "--cluster", "local", "--run-dir", str(ro / "run")]), capsys,
                       "read-only", str(ro))
        one_line_error(dry(ro), capsys, "read-only")


def test_yaml_syntax_error_in_saved_config_names_file_and_line(tmp_path, capsys):
    (tmp_path / "config.yaml").write_text("tiny:\n  parts: [1, 2\nstages: {}\n")
    line = one_line_error(dry(tmp_path), capsys, f"{tmp_path / 'config.yaml'}:3", "YAML syntax error")
    assert "line 3" in line


@pytest.mark.parametrize("kind", ["template", "profile"])
def test_yaml_syntax_error_in_template_or_profile_names_file_and_line(tmp_path, kind):
    (tmp_path / "profiles").mkdir()
    bad = "stages:\n  first:\n    nodes: [1,\n"
    good = "stages: {}\n"
    (tmp_path / "tiny.yaml").write_text(bad if kind == "template" else good)
    (tmp_path / "profiles" / "p.yaml").write_text(bad if kind == "profile" else good)
    pipe = plan.get_pipeline("tiny")
    where = "templates/tiny.yaml:4" if kind == "template" else "templates/profiles/p.yaml:4"
    with pytest.raises(config.ConfigError, match=f"{where}: YAML syntax error.*HINT"):
        config.load(pipe.schema, "tiny", "p", templates=tmp_path, extra=("tiny.yaml",))


def test_profile_that_is_a_list_is_refused(tmp_path):
    (tmp_path / "profiles").mkdir()
    (tmp_path / "profiles" / "p.yaml").write_text("- stages\n- cluster\n")
    pipe = plan.get_pipeline("tiny")
    with pytest.raises(config.ConfigError, match=r"profiles/p.yaml holds a list; expected a mapping.*HINT"):
        config.load(pipe.schema, "tiny", "p", templates=tmp_path)


@pytest.mark.parametrize("profile", ["../langsplat", "", "profiles/sandbox", "sandbox.yaml/.."])
def test_profile_must_be_a_plain_profile_name(tmp_path, capsys, profile):
    one_line_error(dry(tmp_path, "--profile", profile), capsys, "is not a profile name", "['gpu8', 'sandbox']")


@pytest.mark.parametrize("override, limit", [
    ("stages.first.gpus_per_node=100000000000000000000", "limit of 64"),
    ("stages.first.local_tasks=1000", "limit of 64"),
    ("stages.second.nodes=20000", "limit of 10000"),
])
def test_absurd_resource_values_are_refused_with_the_limit(tmp_path, capsys, override, limit):
    one_line_error(dry(tmp_path, override), capsys, limit, override.split("=")[0])


def test_signal_delay_not_below_the_time_limit_is_refused(tmp_path, capsys):
    # the default signal_delay_s=120 with a 2-minute limit: USR2 would come at once
    line = one_line_error(submit.main(["run", "--cluster", "local", "--dry-run", "--run-dir", str(tmp_path),
                                       "stages.main.time_min=2", "--", "true"]), capsys,
                          "stages.main.signal_delay_s=120", "time_min=2 (120 s)")
    assert line.endswith("HINT: lower signal_delay_s or raise time_min.")
    assert dry(tmp_path, "stages.first.time_min=3") == 0  # 180 s > 120 s


def test_a_snapshot_limit_that_is_no_size_is_refused(tmp_path, capsys):
    one_line_error(dry(tmp_path, "run.snapshot_max_mb=0"), capsys, "run.snapshot_max_mb=0", "--no-snapshot")


MANIFESTS = {"empty": b"", "truncated": b'{"pipeline": "tiny", "tasks": {"first": {"sta', "list": b"[]",
             "binary": bytes(range(256)), "no tasks": b'{"pipeline": "tiny"}'}


@pytest.mark.parametrize("name", sorted(MANIFESTS))
def test_damaged_manifest_is_one_line_for_submit_status_and_logs(tmp_path, capsys, name):
    (tmp_path / "manifest.json").write_bytes(MANIFESTS[name])
    one_line_error(dry(tmp_path), capsys, str(tmp_path / "manifest.json"))
    one_line_error(submit.main(["tiny", "--cluster", "local", "--run-dir", str(tmp_path)]), capsys, "manifest.json")
    one_line_error(status.main([str(tmp_path)]), capsys, "manifest.json")
    one_line_error(logs.main([str(tmp_path)]), capsys, "manifest.json")
    assert (tmp_path / "manifest.json").read_bytes() == MANIFESTS[name]  # left for the user to look at


def test_logs_on_a_missing_run_dir(tmp_path, capsys):
    line = one_line_error(logs.main([str(tmp_path / "nosuch")]), capsys, "not found", "manifest.json")
    assert "task None" not in line


def test_cancel_refuses_a_mistyped_directory_or_stage(tmp_path, capsys):
    """Exit 0 with "nothing to cancel" would tell an operator the jobs are gone."""
    run = RunDir(tmp_path / "run")
    run.start("tiny", "{}\n", "slurm")
    run.record("second", 0, "41_0", "slurm")
    run.record("first", None, "40", "local")
    one_line_error(cancel.main([str(tmp_path / "rnu")]), capsys, "not found", "manifest.json")
    one_line_error(cancel.main([str(tmp_path / "run"), "--stage", "secnod"]), capsys, "'secnod'", "'second'")
    # a sweep: the stages of its points
    point = grid.points({"tiny.score": [1]})[0]
    SweepDir(tmp_path / "sweep").save("tiny", {"tiny.score": [1]}, [], None, [point])
    SweepDir(tmp_path / "sweep").point(point.signature).start("tiny", "{}\n", "slurm")
    SweepDir(tmp_path / "sweep").point(point.signature).record("first", None, "40", "local")
    one_line_error(cancel.main([str(tmp_path / "sweep"), "--stage", "frist"]), capsys, "'frist'", "'first'")
    # a real stage whose jobs ran locally: nothing for SLURM to cancel, said so, exit 0
    for path in (run.path, tmp_path / "sweep"):
        assert cancel.main([str(path), "--stage", "first"]) == 0
        assert "no SLURM jobs recorded" in capsys.readouterr().out


def test_the_command_line_prints_no_traceback(tmp_path):
    """The same through the real entry points, in a fresh interpreter."""
    (tmp_path / "manifest.json").write_bytes(b"[]")
    for module, args in (("hpc.status", [str(tmp_path)]), ("hpc.logs", [str(tmp_path / "nosuch")]),
                         ("hpc.cancel", [str(tmp_path / "nosuch")]),
                         ("hpc.submit", ["run", "--cluster", "local", "--profile", "../langsplat", "--dry-run"])):
        out = subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, cwd=ROOT)
        assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
        assert len(out.stderr.strip().splitlines()) == 1, out.stderr
