"""A pipeline's own options (PipelineDef.options) through hpc.submit() and python -m hpc.submit.

    python -m pytest tests/test_submit_options.py -n 0

A string given to a list-valued option (command, resume_args, levels) or to sweep is read as the
command line reads it, never split into characters; a value that cannot be read is one line.
Every dry run here plans and prints, writes nothing and submits nothing.
"""
import subprocess
import sys
from pathlib import Path

import pytest

import hpc
from hpc import submit as submit_cmd
from hpc.pipeline import plan

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def project(tmp_path, monkeypatch):
    """A directory holding the user's script, submitted from; no SLURM: the local executor's plan."""
    monkeypatch.delenv("SLURM_CONF", raising=False)
    monkeypatch.setenv("HPC_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setitem(plan.PIPELINES, "tiny", "tests.tiny_pipeline")
    (tmp_path / "train.py").write_text("print('training')\n")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def planned(capsys, *args, **kwargs) -> str:
    assert hpc.submit(*args, dry_run=True, cluster="local", **kwargs) is None
    return capsys.readouterr().out


def test_a_command_string_is_split_as_the_command_line_splits_it(project, capsys):
    out = planned(capsys, "run", command="python train.py --name 'a b'", run_dir=project / "r")
    assert "each task runs python -m hpc.launch -- python train.py --name 'a b'  (argv, no shell)" in out, out
    same = planned(capsys, "run", command=["python", "train.py", "--name", "a b"], run_dir=project / "r")
    assert same.splitlines()[:3] == out.splitlines()[:3]


def test_resume_args_and_levels_strings_are_split_as_the_command_line_splits_them(project, capsys):
    out = planned(capsys, "run", command="python train.py", resume_if="out/ckpt.pt",
                  resume_args="--init_from resume --from $HPC_LAST_CHECKPOINT", run_dir=project / "r")
    assert "resume: --init_from resume --from '$HPC_LAST_CHECKPOINT' when out/ckpt.pt" in out, out
    levels = planned(capsys, "langsplat", levels="0 2", run_dir=project / "l")
    assert "#SBATCH --array=0-1%2" in levels  # features: two levels, not the characters '0', ' ', '2'


def test_a_sweep_string_is_its_axes_as_on_the_command_line(project, capsys):
    one = planned(capsys, "tiny", sweep="tiny.score=1,2", run_dir=project / "s1")
    assert "2 point(s)" in one and "point " in one and "tiny.score=2:" in one, one
    two = planned(capsys, "tiny", sweep="tiny.score=1,2 tiny.sleep_s=0,1", run_dir=project / "s2")
    assert "4 point(s)" in two, two


def test_the_pipelines_options_stay_keywords_of_hpc_submit(project, capsys):
    out = planned(capsys, "run", nodes="1", tasks_per_node=2, command=["python", "train.py"], run_dir=project / "r")
    assert "#SBATCH --ntasks-per-node=2" in out and "#SBATCH --nodes=1" in out, out
    assert "#SBATCH --gres" not in out  # tasks without GPUs: CPU ranks
    out = planned(capsys, "run", gpus_per_node=2, hang_after_s=60, rank_env=False, command="python train.py",
                  run_dir=project / "g")
    assert "#SBATCH --gpus-per-node=2" in out and "--no-env" in out, out
    with pytest.raises(hpc.ConfigError) as err:
        hpc.submit("langsplat", nodes=2, dry_run=True)
    assert "['nodes']" in str(err.value) and "levels" in str(err.value) and "HINT" in str(err.value)
    with pytest.raises(hpc.ConfigError, match="tasks_per_node= 'two': expected an integer"):
        hpc.submit("run", tasks_per_node="two", command="python train.py", dry_run=True)
    with pytest.raises(hpc.ConfigError, match="rank_env= 'no': expected True or False"):
        hpc.submit("run", rank_env="no", command="python train.py", dry_run=True)


def test_an_unbalanced_quote_is_a_config_error_not_a_traceback(project):
    with pytest.raises(hpc.ConfigError, match="No closing quotation.*HINT"):
        hpc.submit("run", command="python train.py", resume_if="x", resume_args='--x "unbalanced', dry_run=True)
    with pytest.raises(hpc.ConfigError, match="No closing quotation"):
        hpc.submit("run", command="python 'train.py", dry_run=True)


def command(*argv: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**__import__("os").environ, "PYTHONPATH": str(ROOT)}
    env.pop("SLURM_CONF", None)
    return subprocess.run([sys.executable, "-m", "hpc.submit", *argv], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120)


def test_an_unbalanced_resume_args_is_one_line_on_the_command_line(project):
    out = command("run", "--resume-if", "x", "--resume-args", '--x "unbalanced', "--dry-run", "--", "python",
                  "train.py", cwd=project)
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: --resume-args") and "HINT" in lines[0], out.stderr


def test_a_command_after_dashes_for_a_pipeline_without_one_is_refused(project, capsys):
    assert submit_cmd.main(["langsplat", "--dry-run", "--", "python", "train.py"]) == 2
    assert "takes none" in capsys.readouterr().err


def test_help_shows_every_option_of_hpc_and_of_the_pipelines(project):
    every = command("--help", cwd=project)
    assert every.returncode == 0, every.stderr
    for pipe in ("run", "langsplat"):
        for opt in plan.get_pipeline(pipe).options:
            assert (opt.cli if opt.cli != "--" else "-- COMMAND") in every.stdout, opt
    assert "--dry-run" in every.stdout and "--sweep-file" in every.stdout
    run = command("run", "--help", cwd=project)
    assert "--no-rank-env" in run.stdout and "--hang-after" in run.stdout and "-- COMMAND" in run.stdout
    assert "--levels" not in run.stdout and "--dry-run" in run.stdout
