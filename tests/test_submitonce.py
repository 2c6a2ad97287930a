"""hpc.pipeline.submitonce without a controller: the token beside a stage's own comment, and what
hpc.slurm.cli.run says when the look-up for a lost sbatch answer itself fails."""
import subprocess

import pytest

from hpc.pipeline import submitonce
from hpc.slurm import cli, retry

TIMED_OUT = "sbatch: error: Batch job submission failed: Socket timed out on send/recv operation"


def sbatch_lines(tmp_path, **parameters):
    ex = submitonce.SlurmExecutor(folder=tmp_path)
    ex.update_parameters(**parameters)
    ex.parameters = submitonce.with_token(ex.parameters, "ab12")
    return [line for line in ex._make_submission_file_text("python -c pass", "ab12").splitlines()
            if line.startswith("#SBATCH --comment")]


@pytest.mark.parametrize("given, words", [
    ({}, ["hpc:ab12"]),
    ({"comment": "mine"}, ["mine", "hpc:ab12"]),
    ({"additional_parameters": {"comment": "mine"}}, ["mine", "hpc:ab12"]),  # stages.X.extra.comment
    ({"comment": "a", "additional_parameters": {"comment": "b"}}, ["a", "b", "hpc:ab12"]),
])
def test_the_token_is_kept_beside_a_stage_s_own_comment(tmp_path, given, words):
    lines = sbatch_lines(tmp_path, **given)
    assert len(lines) == 1, lines  # one --comment: a second one would win and drop the token
    found = lines[0].split("=", 1)[1].strip("'").split()
    assert found == words
    assert submitonce.find_token(f"41|{' '.join(found)}", "ab12") == "41"


def test_a_failed_look_up_after_a_lost_answer_says_the_job_may_be_queued(monkeypatch):
    monkeypatch.setenv(retry.DEADLINE_ENV, "30")

    def runner(cmd, **kw):
        return subprocess.CompletedProcess(cmd, 1, "", TIMED_OUT)

    def look():
        raise cli.SlurmExit("squeue exited 1: Socket timed out on send/recv operation")

    with pytest.raises(cli.SlurmExit, match="may have been queued all the same, and looking for it failed"):
        cli.run(["sbatch", "job.sh"], runner=runner, lookup=look)


def test_a_caller_s_deadline_bounds_the_first_try_too(monkeypatch):
    seen, slept = [], []
    monkeypatch.setattr(cli.time, "sleep", slept.append)  # pauses pass at once, on a clock of their own
    monkeypatch.setattr(cli.time, "monotonic", lambda: sum(slept) + sum(seen))

    def runner(cmd, **kw):
        seen.append(kw["timeout"])
        raise subprocess.TimeoutExpired(cmd, kw["timeout"])

    with pytest.raises(RuntimeError):
        cli.run(["scontrol", "show", "job", "1"], runner=runner, deadline_s=3, timeout_s=60)
    assert seen and max(seen) <= 3
