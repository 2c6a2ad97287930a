"""Config -> sbatch script: nothing a user writes can add a line to the script.

    python -m pytest tests/test_sbatch_render.py -q

A property-based test feeds arbitrary text (newlines, control characters, quotes, shell syntax) into
every config value and key that reaches a script, through the real command line (dotted overrides and
--run-dir). Whatever is accepted renders scripts whose lines, parsed back, are exactly the expected
#SBATCH lines, setup lines and srun command; whatever is not is refused with a ConfigError.
"""
import json
import shlex
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from hpc.config import schema as config
from hpc.pipeline import plan, sbatch
from hpc import submit
from hpc.pipeline import launcher, submission
from hpc.rundir.run import RunDir

BASE = Path(tempfile.mkdtemp(prefix="hpc-render-"))  # run dirs are made under it, never written
SPECIAL = list("ab-_.:/=%@+,[] \n\r\t\x00\x0b\x1b\x7f\x85\u2028\u2029'\"$;|&`\\#*?~(){}<>!")
TEXT = st.text(st.one_of(st.sampled_from(SPECIAL), st.characters()), max_size=8)
PLAIN = st.from_regex(r"[a-z][a-z0-9_-]{0,6}", fullmatch=True)
# mostly plain, so that most configs are accepted and one odd value is not hidden by another's refusal
TOKEN = st.integers(0, 3).flatmap(lambda k: TEXT if k == 0 else PLAIN)
ACCEPTED = []  # per example: whether the config was accepted (the property is checked on those)


@pytest.fixture(autouse=True)
def tiny(monkeypatch):
    monkeypatch.setitem(plan.PIPELINES, "tiny", "tests.tiny_pipeline")


def dry_run_scripts(argv):
    """What `python -m hpc.submit ... --dry-run` would print: (plan, run dir, setup), or ConfigError."""
    args = submit.parse_args(argv)
    pipe, cfg, run, kind, notes = submission.build(args)
    found = submission.plan_for(pipe, cfg, run, launcher.Submitit(kind), frozenset(), frozenset(), notes)
    return found, run, list(cfg.cluster.setup)


def check_script(text, job, run, setup, expected):
    """The script is exactly: header, one #SBATCH line per expected option, hpc's setup lines (srun under
    hpc.afterstep, given the run dir as one word) and the config's, srun line."""
    lines = text.split("\n")  # bash ends a command at \n, and only there
    assert lines[:3] == ["#!/bin/bash", "", "# Parameters"], text
    flags, i = {}, 3
    while lines[i].startswith("#SBATCH "):
        name, _, value = lines[i][len("#SBATCH --"):].partition("=")
        words = shlex.split(value)
        assert len(words) <= 1 and name not in flags, lines[i]
        flags[name] = words[0] if words else True
        i += 1
    assert set(flags) == set(expected), (sorted(flags), sorted(expected))
    assert all(flags[k] == v for k, v in expected.items()), (flags, expected)
    ours = sbatch.afterstep_setup(job.resources, str(run.path))
    assert shlex.split(ours[1])[2:7] == [sys.executable, "-u", "-m", "hpc.afterstep", str(run.path)], ours
    setup = ours + list(setup)
    assert lines[i:i + 2 + len(setup)] == ["", "# setup", *setup], text
    i += 2 + len(setup)
    assert lines[i:i + 3] == ["", "# command", "export SUBMITIT_EXECUTOR=slurm"] and lines[i + 4:] == [""], text
    shared = job.is_array and len(job.items) > 1  # a SLURM array's tasks share one folder
    out = f"{run.path}/{job.stage}/logs/" + ("%A/%A_%a" if shared else "%A_%a/%A_%a" if job.is_array else "%j/%j")
    assert shlex.split(lines[i + 3]) == [
        "srun", "--unbuffered", "--output", f"{out}_%t_log.out", "--error", f"{out}_%t_log.err",
        "--kill-on-bad-exit=1", sys.executable, "-u", "-m", "submitit.core._submit",
        f"{run.path}/{job.stage}/logs/" + ("%A" if shared else "%j")], lines[i + 3]


# The property and its check run in one process, in this order, also under pytest-xdist (one file, one
# worker: `--dist loadfile`).
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@example(partition="low", qos="q", extra={"x\ntouch /tmp/PWNED\n#": "v"}, setup=[], name="r")
@example(partition="low", qos="q", extra={"mail-type": "END\ntouch /tmp/PWNED"}, setup=[], name="r")
@example(partition="low\n", qos="q", extra={}, setup=[], name="r")
@example(partition="low", qos="q", extra={}, setup=["a\nb", "c\rd"], name="r")
@example(partition="low", qos="q", extra={}, setup=[], name="a\ntouch /tmp/PWNED\n#")
@example(partition="low", qos="q", extra={}, setup=[], name="a=b c")
@given(partition=TOKEN, qos=TOKEN, extra=st.dictionaries(TOKEN, TOKEN, max_size=2),
       setup=st.lists(TOKEN, max_size=2), name=TOKEN)
def test_every_accepted_config_renders_exactly_the_expected_lines(partition, qos, extra, setup, name):
    run_dir = f"{BASE}/{name}"
    argv = ["tiny", "--cluster", "slurm", "--dry-run", "--run-dir", run_dir,
            f"cluster.partitions={json.dumps([partition])}", f"cluster.setup={json.dumps(setup)}",
            f"stages.second.partition={json.dumps(partition)}", f"stages.second.qos={json.dumps(qos)}",
            f"stages.second.extra={json.dumps(extra)}"]
    try:
        p, run, setup_lines = dry_run_scripts(argv)
    except config.ConfigError as err:
        assert "\n" not in str(err) and "HINT" in str(err)
        ACCEPTED.append(False)
        return
    ACCEPTED.append(True)
    for job in p.jobs:
        expected = base_flags(job, run)
        if job.stage == "second":
            expected.update({"partition": partition, "array": "0-2%3", "dependency": "afterok:<first>",
                             "kill-on-invalid-dep": "yes"})  # a failed first ends it: it never pends forever
            expected["qos"] = qos
            expected.update({k.replace("_", "-"): v for k, v in extra.items()})
        check_script(job.sbatch_text(setup=setup_lines), job, run, setup_lines, expected)


def base_flags(job, run):
    """The #SBATCH options of a tiny-pipeline job with default resources."""
    shared = job.is_array and len(job.items) > 1  # a SLURM array's tasks share one folder
    out = f"{run.path}/{job.stage}/logs/" + ("%A/%A_%a" if shared else "%A_%a/%A_%a" if job.is_array else "%j/%j")
    return {"job-name": job.stage, "nodes": "1", "ntasks-per-node": "1", "cpus-per-task": "1", "time": "5",
            "signal": "USR2@120", "open-mode": "append", "wckey": "submitit", "requeue": True,
            "output": f"{out}_0_log.out", "error": f"{out}_0_log.err"}


def test_the_property_saw_accepted_configs():
    """Runs after the property test (file order): it checked scripts, not only refusals."""
    assert ACCEPTED.count(True) >= 5, (ACCEPTED.count(True), len(ACCEPTED))


@pytest.mark.parametrize("override", [
    'stages.second.extra={"x\\ntouch /tmp/PWNED\\n#": v}',  # a key that would start a command line
    'stages.second.extra={"mail-type": "END\\ntouch /tmp/PWNED"}',
    'stages.second.partition="low\\n"',  # `$` in a regex matches before a trailing newline
    'cluster.setup=["module load cuda\\ntouch /tmp/PWNED"]',
    'cluster.setup=["#SBATCH --partition=high"]',  # sbatch would read it as an option
    'stages.second.mem="4G\\u2028x"',
])
def test_injection_attempts_are_refused(override, tmp_path):
    with pytest.raises(config.ConfigError, match="HINT"):
        dry_run_scripts(["tiny", "--cluster", "slurm", "--dry-run", "--run-dir", str(tmp_path),
                         "cluster.partitions=[low]", override])


def test_run_dir_with_a_newline_is_refused(tmp_path):
    with pytest.raises(config.ConfigError, match="control character"):
        dry_run_scripts(["tiny", "--cluster", "slurm", "--dry-run", "--run-dir", f"{tmp_path}/a\ntouch x"])
    with pytest.raises(config.ConfigError, match="control character"):
        root = json.dumps(f"{tmp_path}/r\n")  # the run dir made from the config's run.root
        dry_run_scripts(["tiny", "--cluster", "slurm", "--dry-run", f"run.root={root}"])


def test_plain_values_are_accepted_and_quoted(tmp_path):
    setup = ["module load cuda/12.1", "export A='b c'"]
    p, run, setup_lines = dry_run_scripts([
        "tiny", "--cluster", "slurm", "--dry-run", "--run-dir", f"{tmp_path}/my run", "cluster.partitions=[gpu]",
        "stages.second.partition=gpu", f"cluster.setup={json.dumps(setup)}", 'stages.second.extra={"mail-type": "END"}'])
    assert setup_lines == setup and run.path == RunDir(tmp_path / "my run").path
    job = p.jobs[1]
    text = job.sbatch_text(setup=setup_lines)
    assert "#SBATCH --mail-type=END" in text and f"#SBATCH --output='{run.path}/second/logs/" in text
    check_script(text, job, run, setup, {**base_flags(job, run), "partition": "gpu", "array": "0-2%3",
                                         "dependency": "afterok:<first>", "kill-on-invalid-dep": "yes",
                                         "mail-type": "END"})
