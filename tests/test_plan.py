"""Planning and dry-run: golden sbatch scripts, skip logic, no torch, speed, quoting."""
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from hpc.config import schema as config
from hpc.pipeline import plan
from hpc.rundir.run import RunDir

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = Path(__file__).parent / "golden" / "dryrun"
CASES = {
    "langsplat_sandbox": ["langsplat", "--cluster", "slurm", "--profile", "sandbox"],
    "langsplat_gpu8_levels_0_2": ["langsplat", "--cluster", "slurm", "--profile", "gpu8",
                                  "stages.features.partition=gpu", "stages.rgb.partition=gpu",
                                  "cluster.partitions=[gpu]", "cluster.setup=[module load cuda]",
                                  "--levels", "0", "2"],
    "langsplat_local": ["langsplat", "--cluster", "local"],
    "run_sandbox": ["run", "--cluster", "slurm", "--profile", "sandbox", "--nodes", "2", "--gpus-per-node", "2",
                    "--", "python", "train.py", "--lr", "1e-3"],
    # notify.mail: SLURM's own mail (sbatch --mail-user, --mail-type from the events asked for)
    "run_sandbox_mail": ["run", "--cluster", "slurm", "--profile", "sandbox", "notify.mail=me@site.org",
                         "notify.events=[task_failed,requeued,run_completed]", "--", "python", "train.py"],
}


def dry_run(args, run_dir="/RUN"):
    cmd = [sys.executable, "-m", "hpc.submit", *args[:1], "--dry-run", "--run-dir", run_dir, *args[1:]]
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env={**os.environ, "SLURM_CONF": "/nonexistent"})
    return out


@pytest.mark.parametrize("name", sorted(CASES))
def test_dry_run_matches_golden(name):
    out = dry_run(CASES[name])
    assert out.returncode == 0, out.stderr
    text = out.stdout.replace(shlex.quote(sys.executable), "PYTHON").replace(str(ROOT), "CHECKOUT")
    path = GOLDEN / f"{name}.txt"
    if os.environ.get("HPC_UPDATE_GOLDEN"):
        path.write_text(text)
    assert text == path.read_text()


def test_dry_run_imports_no_torch():
    """How fast it answers is measured by the submission benchmark (python -m bench --only
    submission), beside plain submitit: a shared machine makes a timed test a coin toss."""
    code = ("import sys; from hpc import submit; "
            "submit.main(['langsplat', '--cluster', 'slurm', '--profile', 'sandbox', '--dry-run', '--run-dir', '/RUN']); "
            "print('TORCH', 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    words = out.stdout.split()
    assert words[words.index("TORCH") + 1] == "False"


def test_command_is_not_interpreted_by_a_shell():
    out = dry_run(["run", "--cluster", "slurm", "--profile", "sandbox", "--", "python", "t.py", "$(touch /tmp/pwned)"])
    assert out.returncode == 0, out.stderr
    summary, scripts = out.stdout.split("# ---- sbatch script", 1)
    assert "$(touch" not in scripts  # the command travels in submitit's pickle, not in the script
    assert "python t.py '$(touch /tmp/pwned)'" in summary  # shown shell-quoted: one argument


def test_unsafe_sbatch_value_is_refused():
    out = dry_run(["langsplat", "--cluster", "slurm", "--profile", "sandbox", "stages.rgb.qos=a b;reboot"])
    assert out.returncode == 2
    assert "stages.rgb.qos" in out.stderr and "HINT" in out.stderr


@pytest.mark.parametrize("override, expect", [
    (["stages.rgb.gpus_per_node=-2"], "cannot be negative"),
    (["stages.rgb.gpus_per_node=many"], "stages.rgb.gpus_per_node"),
    (["stages.rgb.gpu=1"], "valid keys under stages.rgb"),
    (["langsplat.bogus=1"], "unknown config key 'langsplat.bogus'"),
    (["--levels", "0", "7"], "[0, 1, 2]"),  # the valid levels are named
    (["langsplat.mode=external", "langsplat.data_path=/no/such/dir"], "is not a directory"),
    (["stages.features.partition=gpu"], "expected one of ['high', 'low']"),
    (["--profile", "nosuch"], "unknown profile 'nosuch'"),
])
def test_bad_input_is_refused_with_valid_choices(override, expect):
    out = dry_run(["langsplat", "--cluster", "slurm", "--profile", "sandbox", *override])
    assert out.returncode == 2, out.stdout
    assert expect in out.stderr and "HINT" in out.stderr


def load(pipeline="tiny", overrides=()):
    plan.PIPELINES["tiny"] = "tests.tiny_pipeline"
    pipe = plan.get_pipeline(pipeline)
    return pipe, config.load(pipe.schema, pipeline, None, list(overrides))


def test_plan_skips_done_and_queued_tasks(tmp_path):
    pipe, cfg = load()
    run = RunDir(tmp_path)
    run.mark_done("first", None, {})
    run.mark_done("second", 0, {})
    p = plan.make_plan(pipe, cfg, str(tmp_path), "slurm", run.finished([("first", None), ("second", 0),
                                                                         ("second", 1)]),
                       frozenset({("second", 1)}))
    assert [j.stage for j in p.jobs] == ["second"]
    assert p.jobs[0].items == (2,) and p.jobs[0].indices == (2,)
    assert p.jobs[0].after == ()  # `first` is done: no dependency on a job that is not submitted
    assert any("second[0]: done" in s for s in p.skipped) and any("second[1]: already" in s for s in p.skipped)


def test_plan_chains_stages_and_reduces_ranks_locally(tmp_path):
    pipe, cfg = load(overrides=["stages.second.nodes=2", "stages.second.tasks_per_node=2",
                                "stages.second.local_tasks=2"])
    slurm = plan.make_plan(pipe, cfg, str(tmp_path), "slurm")
    assert [(j.stage, j.after, j.ranks) for j in slurm.jobs] == [("first", (), 1), ("second", ("first",), 4)]
    local = plan.make_plan(pipe, cfg, str(tmp_path), "local")
    assert local.jobs[1].ranks == 2
    assert any("4 rank(s)" in n and "2 process(es)" in n for n in local.notes)
    assert any("no afterok" in n for n in local.notes)


def test_a_time_limit_signal_due_at_the_start_is_named_with_the_limit_that_avoids_it(tmp_path):
    """SLURM sends the signal at its first look once the limit is within signal_delay_s + 30 s, to the
    tasks started by then: a 1-minute limit with a 40 s window makes it due at the start."""
    pipe, cfg = load(overrides=["stages.first.time_min=1", "stages.first.signal_delay_s=40"])
    (note,) = [n for n in plan.make_plan(pipe, cfg, str(tmp_path), "slurm").notes if "time-limit signal" in n]
    assert note.startswith("stages.first: ") and "HINT: stages.first.time_min=2 or more" in note
    assert not [n for n in plan.make_plan(pipe, cfg, str(tmp_path), "local").notes if "time-limit signal" in n]
    pipe, cfg = load(overrides=["stages.first.time_min=2", "stages.first.signal_delay_s=60"])
    assert not [n for n in plan.make_plan(pipe, cfg, str(tmp_path), "slurm").notes if "time-limit signal" in n]


def test_precedence_defaults_template_saved_profile_command_line(tmp_path):
    pipe = plan.get_pipeline("langsplat")
    saved = tmp_path / "config.yaml"
    saved.write_text("stages:\n  rgb:\n    time_min: 7\n    cpus_per_task: 3\n    max_timeouts: 4\n")
    notes = []
    cfg = config.load(pipe.schema, "langsplat", "sandbox", ["stages.rgb.cpus_per_task=5"], saved,
                      extra=pipe.templates, notes=notes)
    assert cfg.stages.features.signal_delay_s == 120  # dataclass default
    assert cfg.stages.features.local_tasks == 2  # templates/langsplat.yaml
    assert cfg.stages.rgb.max_timeouts == 4  # the run directory's saved config
    assert cfg.stages.features.nodes == 2 and cfg.cluster.partitions == ["low", "high"]  # profile
    assert cfg.stages.rgb.time_min == 20  # a profile named on a resubmission outranks the saved config
    assert cfg.stages.rgb.cpus_per_task == 5  # command line wins
    # and the plan is told what the profile changed in the saved config
    assert len(notes) == 1 and "profile sandbox applied over the saved" in notes[0]
    assert "stages.rgb.time_min 7 -> 20" in notes[0]


def test_plan_waits_for_a_stage_still_queued_from_an_earlier_submission(tmp_path):
    pipe, cfg = load()
    p = plan.make_plan(pipe, cfg, str(tmp_path), "slurm", frozenset(), frozenset({("first", None)}))
    assert [(j.stage, j.after) for j in p.jobs] == [("second", ("first",))]


def test_profile_named_on_a_resubmission_is_applied_over_the_saved_config(tmp_path):
    # the run dir was submitted with --profile gpu8 and one override; a resubmission asks for sandbox
    pipe = plan.get_pipeline("run")
    saved = config.load(pipe.schema, "run", "gpu8", ["stages.main.cpus_per_task=4"], extra=pipe.templates)
    (tmp_path / "config.yaml").write_text(config.to_yaml(saved))
    out = dry_run(["run", "--cluster", "slurm", "--profile", "sandbox", "stages.main.time_min=30", "--", "true"],
                  str(tmp_path))
    assert out.returncode == 0, out.stderr
    assert "#SBATCH --partition=low" in out.stdout and "#SBATCH --time=30" in out.stdout  # command line highest
    assert "#SBATCH --cpus-per-task=1" in out.stdout  # the profile's, over the saved 4
    assert "#SBATCH --gpus-per-node=8" in out.stdout  # saved: the sandbox profile does not name it
    assert f"note: profile sandbox applied over the saved {tmp_path / 'config.yaml'}: " in out.stdout
    assert "stages.main.cpus_per_task 4 -> 1" in out.stdout
    # without --profile the saved config stands
    out = dry_run(["run", "--cluster", "slurm", "cluster.partitions=[low]", "--", "true"], str(tmp_path))
    assert "#SBATCH --cpus-per-task=4" in out.stdout and "#SBATCH --gpus-per-node=8" in out.stdout, out.stderr
