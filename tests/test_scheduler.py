"""Pure parts of hpc.scheduler: sacct parsing, array ids, the state table."""
from hpc import scheduler


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
    assert scheduler.detect("auto") == "local"
    assert scheduler.detect("debug") == "debug"
