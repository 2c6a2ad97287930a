"""Pure parts of hpc.slurm.scheduler: sacct and squeue parsing, array ids, the state table, detection,
and how it takes an empty squeue answer (over fake clients wrapped by faults.slurmshim)."""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hpc.pipeline import plan
from hpc.slurm import scheduler


def test_expand_array_id():
    assert scheduler.expand_array_id("12_[0-2%4]") == ["12_0", "12_1", "12_2"]
    assert scheduler.expand_array_id("12_[0,3-4]") == ["12_0", "12_3", "12_4"]
    assert scheduler.expand_array_id("12_5") == ["12_5"]
    assert scheduler.expand_array_id("7") == ["7"]


# Rows recorded on the local cluster with `sacct -X -D -P -n -o <SACCT_FIELDS> -j ...`.
# 65 failed; 66 is an array with afterok:65 (sacct's Reason still says Dependency where squeue
# already says DependencyNeverSatisfied); 67 was requeued by scontrol and runs again; 70 was
# preempted and runs again; 74 runs two tasks at a time, the rest pend as one row.
SACCT = """\
65|FAILED|None|00:00:02|2026-11-22T03:18:32|2026-11-22T03:18:34|1:0|n1
66_[0-2]|PENDING|Dependency|00:00:00|Unknown|Unknown|0:0|None assigned
67|REQUEUED|None|00:00:00|2026-11-22T03:18:42|2026-11-22T03:18:42|0:0|n1
67|RUNNING|BeginTime|00:00:01|2026-11-22T03:18:47|Unknown|0:0|n1
70|PREEMPTED|None|00:00:22|2026-11-22T03:19:17|2026-11-22T03:19:39|0:0|n1
70|RUNNING|None|00:00:10|2026-11-22T03:19:42|Unknown|0:0|n1
74_0|RUNNING|None|00:00:06|2026-11-22T03:21:29|Unknown|0:0|n1
74_1|RUNNING|None|00:00:06|2026-11-22T03:21:29|Unknown|0:0|n1
74_[2-3%2]|PENDING|JobArrayTaskLimit|00:00:00|Unknown|Unknown|0:0|None assigned
"""


def test_pending_array_row_stands_for_the_wanted_tasks_without_a_row_of_their_own():
    recs = scheduler.parse_sacct(SACCT, ["66_0", "66_2", "74_0", "74_3", "99"])
    assert sorted(recs) == ["66_0", "66_2", "74_0", "74_3"]  # 99: not in sacct (yet), the caller decides
    assert recs["66_2"].state == "PENDING" and recs["66_2"].reason == "Dependency"
    assert recs["74_0"].state == "RUNNING" and recs["74_3"].reason == "JobArrayTaskLimit"
    # a task with its own row is never overridden by the array's pending row
    own = SACCT + "74_2|FAILED|None|00:00:01|a|b|1:0|n2\n"
    assert scheduler.parse_sacct(own, ["74_2"])["74_2"].state == "FAILED"


def test_restarts_count_one_per_requeue():
    recs = scheduler.parse_sacct(SACCT, ["65", "67", "70"])
    assert recs["67"].state == "RUNNING" and recs["67"].restarts == 1
    assert recs["70"].state == "RUNNING" and recs["70"].restarts == 1
    assert recs["65"].restarts == 0 and recs["65"].exit_code == "1:0"
    # right after a preemption the job's only record is PREEMPTED: it is queued again, one restart
    waiting = scheduler.parse_sacct("70|PREEMPTED|None|00:00:22|a|b|0:0|n1\n", ["70"])["70"]
    assert waiting.state in scheduler.ACTIVE and waiting.restarts == 1


def test_never_starts_from_the_upstream_state_in_the_same_answer():
    recs = scheduler.parse_sacct(SACCT, ["65", "66_0", "66_1", "66_2", "67", "74_3"])
    after = {f"66_{i}": ["65"] for i in range(3)}
    after["74_3"] = ["67"]  # upstream still running: may start later
    never = scheduler.never_starts(recs, after)
    assert sorted(never) == ["66_0", "66_1", "66_2"]
    assert never["66_1"].job_id == "65" and never["66_1"].state == "FAILED"


def test_never_starts_trusts_slurms_reason_when_the_upstream_is_unknown():
    recs = scheduler.parse_sacct("4|PENDING|DependencyNeverSatisfied|0|a|b|0:0|n1\n"
                                 "5|PENDING|Dependency|0|a|b|0:0|n1\n", ["4", "5"])
    assert scheduler.never_starts(recs, {"5": ["3"]}) == {"4": None}


def test_state_table_covers_terminal_and_active_states():
    assert {scheduler.STATES[s] for s in ("PENDING", "REQUEUED", "RUNNING", "COMPLETING")} <= scheduler.ACTIVE
    for word, state in [("COMPLETED", "COMPLETED"), ("OUT_OF_MEMORY", "FAILED"), ("TIMEOUT", "TIMEOUT"),
                        ("CANCELLED", "CANCELLED"), ("NODE_FAIL", "FAILED")]:
        assert scheduler.STATES[word] == state
    recs = scheduler.parse_sacct("3|CANCELLED by 0|None|0|a|b|0:0|n1\n", ["3"])
    assert recs["3"].state == "CANCELLED"


def test_auto_falls_back_to_local_when_no_controller_answers(monkeypatch, tmp_path):
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "missing.conf"))
    kind = scheduler.detect("auto")
    assert kind == "local" and "scontrol ping" in kind.why_not_slurm
    assert scheduler.detect("debug") == "debug" and scheduler.detect("debug").why_not_slurm == ""


def test_auto_without_scontrol_says_so(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    kind = scheduler.detect("auto")
    assert kind == "local" and kind.why_not_slurm == "scontrol is not on PATH"


def test_plan_says_which_gpu_stage_runs_on_the_cpu_when_auto_fell_back():
    from hpc.config import schema as config
    from tests.tiny_pipeline import PIPELINE

    cfg = config.load(PIPELINE.schema, "tiny", None, ["stages.second.gpus_per_node=8",
                                                      "stages.second.local_tasks=2"], None)
    notes = plan.make_plan(PIPELINE, cfg, "/RUN", scheduler.Kind("local", "scontrol ping: no answer")).notes
    assert ("no SLURM answered (scontrol ping: no answer); stage second asks for 8 GPUs per node and runs "
            "as 2 CPU process(es) here") in notes
    assert not any("SLURM answered" in n for n in plan.make_plan(PIPELINE, cfg, "/RUN", "local").notes)


# `squeue -h -t all -O JobArrayID:|,State:|,...,RestartCnt:|` on the local cluster without accounting:
# 8 ended at its time limit (squeue keeps it MinJobAge seconds), 9 waits on it forever, 10 was
# requeued once, 11 is an array with two tasks running and two pending as one row.
SQUEUE = """8|TIMEOUT|TimeLimit|1:12|2026-11-22T20:47:07|2026-11-22T20:48:19|n1|0|
9|PENDING|DependencyNeverSatisfied|0:00|N/A|N/A||0|
10|RUNNING|None|0:03|2026-11-22T20:50:01|2026-11-22T21:50:01|n[1-2]|1|
11_0|RUNNING|None|0:01|2026-11-22T20:51:00|2026-11-22T20:56:00|n1|0|
11_1|COMPLETING|None|0:01|2026-11-22T20:51:00|2026-11-22T20:56:00|n2|0|
11_[2-3%2]|PENDING|JobArrayTaskLimit|0:00|N/A|N/A||0|
"""


def test_parse_squeue_reads_states_reasons_restarts_and_pending_arrays():
    recs = scheduler.parse_squeue(SQUEUE, ["8", "9", "10", "11_1", "11_3", "12"])
    assert sorted(recs) == ["10", "11_1", "11_3", "8", "9"]  # 12: slurmctld forgot it (or never knew)
    assert recs["8"].state == "TIMEOUT" and recs["8"].reason == "TimeLimit"
    assert recs["10"].restarts == 1 and recs["10"].nodes == "n[1-2]"
    assert recs["11_1"].state == "RUNNING" and recs["11_3"].reason == "JobArrayTaskLimit"
    assert scheduler.never_starts(recs, {"9": ["8"]})["9"].job_id == "8"


def test_a_job_killed_at_its_time_limit_is_timeout_whatever_its_state_word():
    # scontrol and squeue show COMPLETING while SLURM kills the job, sacct's steps CANCELLED
    for word in ("COMPLETING", "CANCELLED", "CANCELLED by 0", "COMPLETING+TIMEOUT", "TIMEOUT"):
        assert scheduler.hpc_state(word, "TimeLimit") == "TIMEOUT", word
    assert scheduler.hpc_state("CANCELLED by 0", "None") == "CANCELLED"
    assert scheduler.hpc_state("COMPLETED", "TimeLimit") == "COMPLETED"  # it finished in time after all


@settings(max_examples=50, deadline=None)
@given(st.sampled_from(sorted(scheduler.STATES)), st.text(alphabet="ABCNoeimnt ", max_size=12))
def test_the_state_table_decides_unless_the_reason_is_a_time_limit(word, reason):
    expected = scheduler.STATES[word]
    if reason in scheduler.REASONS and expected not in ("COMPLETED", "PENDING"):
        expected = scheduler.REASONS[reason]
    assert scheduler.hpc_state(f"{word} by 0", reason) == expected


def test_a_failing_slurm_client_is_one_line_with_its_deciding_error(monkeypatch, tmp_path):
    # sinfo and friends print a chain of errors on stderr; a user sees only the last, on one line
    fake = tmp_path / "sinfo"
    fake.write_text("#!/bin/sh\necho 'sinfo: error: first' >&2\necho 'sinfo: fatal: the decisive one' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    try:
        scheduler.partitions()
    except RuntimeError as err:
        message = str(err)
    else:
        raise AssertionError("a failing sinfo must raise")
    assert "\n" not in message and "the decisive one" in message and "first" not in message


def _fake_site(tmp_path, monkeypatch, scontrol_says: str):
    """A site without accounting whose squeue lists job 5 pending; faults.slurmshim wraps the clients."""
    from faults.slurmshim import SlurmShim

    real = tmp_path / "real"
    real.mkdir(parents=True)
    clients = {"sacct": "echo 'sacct: error: Slurm accounting storage is disabled' >&2; exit 1",
               "squeue": "echo '5|PENDING|Priority|0:00|N/A|N/A||0|'",
               "scontrol": scontrol_says}
    for name, body in clients.items():
        (real / name).write_text(f"#!/bin/sh\n{body}\n")
        (real / name).chmod(0o755)
    shim = SlurmShim(tmp_path / "shim")
    for key, value in shim.env({"PATH": f"{real}:/usr/bin:/bin"}).items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "slurm.conf"))  # a site of its own
    return shim


def test_an_empty_squeue_answer_for_a_job_slurmctld_still_holds_is_asked_again(tmp_path, monkeypatch):
    from faults.slurmshim import EMPTY

    shim = _fake_site(tmp_path, monkeypatch, "echo 'JobId=5 JobState=PENDING'").rule("squeue", [1], EMPTY)
    answer = scheduler.query(["5"])
    assert answer.source == "squeue" and answer["5"].state == "PENDING"
    assert [c[0] for c in shim.calls()] == ["sacct", "squeue", "scontrol", "squeue"]


def test_an_empty_squeue_answer_for_forgotten_jobs_stands_and_twice_empty_is_an_error(tmp_path, monkeypatch):
    from faults.slurmshim import EMPTY

    forgot = "echo 'slurm_load_jobs error: Invalid job id specified' >&2; exit 1"
    shim = _fake_site(tmp_path, monkeypatch, forgot).rule("squeue", [1], EMPTY)
    assert scheduler.query(["5"]) == {}
    assert [c[0] for c in shim.calls()] == ["sacct", "squeue", "scontrol"]
    shim = _fake_site(tmp_path / "b", monkeypatch, "echo 'JobId=5 JobState=PENDING'").rule("squeue", [1, 2], EMPTY)
    with pytest.raises(RuntimeError, match="squeue answered nothing twice .* HINT: "):
        scheduler.query(["5"])
    assert len(shim.calls("squeue")) == 2
