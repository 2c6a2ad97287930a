"""Pure parts of hpc.scheduler: sacct parsing, array ids, the state table."""
from hpc import scheduler


def test_expand_array_id():
    assert scheduler.expand_array_id("12_[0-2%4]") == ["12_0", "12_1", "12_2"]
    assert scheduler.expand_array_id("12_[0,3-4]") == ["12_0", "12_3", "12_4"]
    assert scheduler.expand_array_id("12_5") == ["12_5"]
    assert scheduler.expand_array_id("7") == ["7"]


SACCT = """\
5|PREEMPTED|None|00:00:40|2026-01-01T10:00:00|2026-01-01T10:00:40|0:15|n1
5|REQUEUED|None|00:00:00|2026-01-01T10:00:41|2026-01-01T10:00:41|0:0|n1
5|RUNNING|None|00:00:12|2026-01-01T10:03:00|Unknown|0:0|n[1-2]
6_[1-2%3]|PENDING|Dependency|00:00:00|Unknown|Unknown|0:0|None assigned
6_0|FAILED|None|00:00:02|2026-01-01T10:01:00|2026-01-01T10:01:02|1:0|n2
"""


def test_parse_sacct_counts_requeues_and_expands_pending_arrays():
    recs = scheduler.parse_sacct(SACCT, ["5", "6_0", "6_1", "6_2", "9"])
    assert recs["5"].state == "RUNNING" and recs["5"].restarts == 2
    assert recs["6_0"].state == "FAILED" and recs["6_0"].exit_code == "1:0"
    assert recs["6_2"].state == "PENDING" and recs["6_2"].reason == "Dependency"
    assert "9" not in recs  # not in sacct (yet): the caller decides


def test_state_table_covers_terminal_and_active_states():
    assert {scheduler.STATES[s] for s in ("PENDING", "REQUEUED", "RUNNING", "COMPLETING")} <= scheduler.ACTIVE
    for word, state in [("COMPLETED", "COMPLETED"), ("OUT_OF_MEMORY", "FAILED"), ("TIMEOUT", "TIMEOUT"),
                        ("CANCELLED", "CANCELLED"), ("NODE_FAIL", "FAILED")]:
        assert scheduler.STATES[word] == state
    recs = scheduler.parse_sacct("3|CANCELLED by 0|None|0|a|b|0:0|n1\n", ["3"])
    assert recs["3"].state == "CANCELLED"


def test_orphaned_means_pending_on_a_dependency_that_failed():
    rec = scheduler.parse_sacct("4|PENDING|DependencyNeverSatisfied|0|a|b|0:0|n1\n", ["4"])["4"]
    assert rec.orphaned
    assert not scheduler.parse_sacct("4|PENDING|Dependency|0|a|b|0:0|n1\n", ["4"])["4"].orphaned


def test_auto_falls_back_to_local_when_no_controller_answers(monkeypatch, tmp_path):
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "missing.conf"))
    assert scheduler.detect("auto") == "local"
    assert scheduler.detect("debug") == "debug"
