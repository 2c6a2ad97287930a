"""hpc.slurm.retry's table and hpc.slurm.cli.run's retries, over a scripted client (no controller)."""
import subprocess

import pytest

from hpc.slurm import cli, retry

TRANSIENT = [
    "sbatch: error: Batch job submission failed: Socket timed out on send/recv operation",
    "squeue: error: slurm_load_jobs error: Socket timed out on send/recv operation",
    "sbatch: error: Batch job submission failed: Resource temporarily unavailable",
    "scontrol: error: Unable to contact slurm controller (connect failure)",
    "squeue: error: Transport endpoint is not connected",
    "scontrol: error: Zero Bytes were transmitted or received",
    "sacct: error: slurm_persist_conn_open_without_init: failed to open persistent connection to host:db:6819: "
    "Connection refused",
    "sacct: error: Problem talking to the database: Connection refused",
    "sinfo: error: slurm_receive_msg: Socket timed out on send/recv operation",
]
DEFINITE = [
    "sbatch: error: Batch job submission failed: Invalid partition name specified",
    "sbatch: error: Batch job submission failed: Invalid account or account/partition combination specified",
    "sbatch: error: Batch job submission failed: Invalid qos specification",
    "sbatch: error: invalid option -- 'Z'",
    "sbatch: unrecognized option '--bogus'",
    "sbatch: error: QOSMaxSubmitJobPerUserLimit\nsbatch: error: Batch job submission failed: Job violates "
    "accounting/QOS policy (job submit limit, user's size and/or time limits)",
    "sbatch: error: AssocMaxSubmitJobLimit",
    "scontrol: error: Invalid job id specified",
    "scancel: error: Kill job error on job id 12: Invalid job id specified",
    "sacct: error: Slurm accounting storage is disabled",
    "something hpc has never seen",
]


@pytest.mark.parametrize("words", TRANSIENT)
def test_a_busy_controller_is_transient(words):
    assert retry.classify(words) == retry.TRANSIENT


@pytest.mark.parametrize("words", DEFINITE)
def test_a_refusal_is_definite(words):
    assert retry.classify(words) == retry.DEFINITE


class Script:
    """A client run: each call takes the next (exit status, stdout, stderr); counts the calls."""

    def __init__(self, *answers):
        self.answers, self.calls = list(answers), 0

    def __call__(self, cmd, **kw):
        self.calls += 1
        code, out, err = self.answers.pop(0)
        if code is None:
            raise subprocess.TimeoutExpired(cmd, kw["timeout"])
        return subprocess.CompletedProcess(cmd, code, out, err)


@pytest.fixture
def no_sleep(monkeypatch):
    """Pauses are recorded, and pass on a clock of their own, at once."""
    slept = []
    monkeypatch.setattr(cli.time, "sleep", slept.append)
    monkeypatch.setattr(cli.time, "monotonic", lambda: sum(slept))
    return slept


TIMED_OUT = (1, "", "squeue: error: slurm_load_jobs error: Socket timed out on send/recv operation\n")


def test_transient_failures_are_retried_with_one_line_each(no_sleep, capsys):
    script = Script(TIMED_OUT, TIMED_OUT, (0, "12|RUNNING\n", ""))
    assert cli.run(["squeue", "-h"], runner=script, deadline_s=60) == "12|RUNNING\n"
    assert script.calls == 3 and len(no_sleep) == 2 and 0.5 <= no_sleep[0] <= 1.5 and 1 <= no_sleep[1] <= 3
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 2 and lines[0].startswith("[hpc] squeue: slurm_load_jobs error: Socket timed out")
    assert "(attempt 2, " in lines[0] and "(attempt 3, " in lines[1]


def test_nothing_failing_adds_no_call_and_no_pause(no_sleep, capsys):
    script = Script((0, "ok", ""))
    assert cli.run(["sinfo"], runner=script) == "ok"
    assert (script.calls, no_sleep, capsys.readouterr().err) == (1, [], "")


def test_a_refusal_is_never_retried(no_sleep):
    script = Script((1, "", "sbatch: error: Batch job submission failed: Invalid partition name specified\n"))
    with pytest.raises(cli.SlurmExit, match="Invalid partition name specified"):
        cli.run(["sbatch", "x.sh"], runner=script)
    assert (script.calls, no_sleep) == (1, [])


def test_the_deadline_ends_the_retries_with_slurms_words(no_sleep, monkeypatch):
    monkeypatch.setenv(retry.DEADLINE_ENV, "4")
    script = Script(*[TIMED_OUT] * 10)
    with pytest.raises(cli.SlurmExit, match=r"Socket timed out on send/recv operation \(tried [0-9] times"):
        cli.run(["squeue"], runner=script)
    assert 2 <= script.calls <= 4 and sum(no_sleep) <= 4


def test_a_client_that_gives_no_answer_is_retried_then_reported_as_before(no_sleep):
    with pytest.raises(RuntimeError, match=r"squeue gave no answer within [0-9.]+ s \(tried [23] times") as err:
        cli.run(["squeue"], timeout_s=5, runner=Script(*[(None, "", "")] * 10), deadline_s=3)
    assert not isinstance(err.value, cli.SlurmExit)


def test_sbatch_that_may_have_queued_is_not_sent_again_unless_looked_up(no_sleep):
    timed_out = (1, "", "sbatch: error: Batch job submission failed: Socket timed out on send/recv operation\n")
    script = Script(timed_out)
    with pytest.raises(cli.SlurmExit, match="may have been queued all the same"):
        cli.run(["sbatch", "x.sh"], runner=script)
    assert script.calls == 1
    assert cli.run(["sbatch", "x.sh"], runner=Script(timed_out), lookup=lambda: "77\n") == "77\n"
    script = Script(timed_out, (0, "78\n", ""))
    assert cli.run(["sbatch", "x.sh"], runner=script, lookup=lambda: None) == "78\n" and script.calls == 2


def test_a_controller_that_cannot_be_reached_is_retried_for_sbatch_too(no_sleep):
    script = Script((1, "", "sbatch: error: Unable to contact slurm controller (connect failure)\n"), (0, "5\n", ""))
    assert cli.run(["sbatch", "x.sh"], runner=script) == "5\n" and script.calls == 2


def test_a_bad_deadline_setting_is_one_line_with_a_hint(monkeypatch):
    monkeypatch.setenv(retry.DEADLINE_ENV, "soon")
    with pytest.raises(RuntimeError, match="HINT: export HPC_SLURM_RETRY_S=60"):
        retry.deadline_s()


LOST = (None, "", "")  # scancel's answer lost: the client gave none within its timeout
ENDING = "scancel: error: Kill job error on job id {}: Job/step already completing or completed"
GONE = "scancel: error: Kill job error on job id {}: Invalid job id specified"


def test_a_cancel_asked_again_after_its_answer_was_lost_is_done_when_slurm_says_the_jobs_are_ending(no_sleep):
    """The first scancel ended the jobs but its answer was lost; SLURM's words to the retry say so."""
    from hpc.slurm import scheduler

    both = f"{ENDING.format(12)}\n{GONE.format('13_2')}\n"
    script = Script(LOST, (1, "", both))
    assert scheduler.cancel(["13_2", "12"], runner=script) == ["12", "13_2"] and script.calls == 2
    script = Script((1, "", "scancel: error: Socket timed out on send/recv operation\n"), (1, "", ENDING.format(12)))
    assert scheduler.cancel(["12"], runner=script) == ["12"] and script.calls == 2


def test_a_cancel_is_still_refused_for_a_job_not_asked_a_refusal_or_a_first_answer(no_sleep):
    from hpc.slurm import scheduler

    for answers in ([LOST, (1, "", ENDING.format(14))],  # a job not asked for
                    [LOST, (1, "", f"{ENDING.format(12)}\nscancel: error: Kill job error on job id 13: "
                                   "Access/permission denied\n")],
                    [(1, "", GONE.format(12))]):  # no retry: the id itself is wrong
        with pytest.raises(cli.SlurmExit):
            scheduler.cancel(["12", "13"], runner=Script(*answers))
