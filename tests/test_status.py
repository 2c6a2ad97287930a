"""Pure parts of hpc.status: progress read from real tqdm output, the table."""
import json
from pathlib import Path

import pytest
from tqdm import tqdm

from hpc.monitor import logs, status, table

from hpc import status as status_cmd
from hpc.rundir.run import RunDir


def _write_bar(path: Path, steps: int, **kw) -> None:
    with path.open("w") as fh:  # as a task's stderr log: tqdm writes there, redrawing with \r
        bar = tqdm(file=fh, mininterval=0, **kw)
        for _ in range(steps):
            bar.update(1)
        fh.write("a warning printed after the last redraw\n")
        bar.update(0)
        fh.flush()


@pytest.mark.parametrize("kw, expected", [
    (dict(total=300), "164/300"),
    (dict(total=300, desc="train"), "train 164/300"),
    (dict(total=300, ascii=True), "164/300"),
    (dict(total=3000, unit_scale=True, desc="step 2: fit"), "step 2: fit 164/3.00k"),
    (dict(), "164"),
])
def test_progress_is_tqdms_latest_redraw_in_the_stderr_log(tmp_path, kw, expected):
    log = tmp_path / "1_0_log.err"
    _write_bar(log, 164, **kw)
    assert status.tqdm_progress(log) == expected


def test_no_tqdm_no_progress(tmp_path):
    log = tmp_path / "1_0_log.err"
    log.write_text("Traceback (most recent call last):\nRuntimeError: boom [at 3]\n")
    assert status.tqdm_progress(log) == ""
    assert status.tqdm_progress(tmp_path / "missing.err") == ""


def test_the_table_shows_progress_or_why():
    row = status.TaskStatus("second[1]", "second", 1, "7_1", "RUNNING", 0, "0:05", "164/300", [], "")
    ended = status.TaskStatus("first", "first", None, "6", status.ENDED, 0, "", "", [], status.ENDED_WHY)
    drawn = table.format_table([row, ended])
    assert "164/300" in drawn.splitlines()[1] and "no accounting" in drawn.splitlines()[2]


def _run_with_two_tasks(tmp_path):
    """A local run: task 0 finished on 24 ranks (its done marker says so); task 1 runs, restarted once,
    and its rank-0 log has a start line per start, the latest on 8 ranks."""
    run = RunDir(tmp_path / "run")
    run.start("p", "{}\n", "local")
    run.record_all("train", [(0, "11"), (1, "12")], "local")
    run.task_dir("train", 0).mkdir(parents=True)
    run.mark_done("train", 0, {"started": 0.0, "finished": 65.0, "world_size": 24, "nodes": 3})
    log = run.log_path("train", "12")
    log.parent.mkdir(parents=True)
    start = "[hpc] stage train item 1 rank 0/{} on {} node(s) job 12 restart {}\n"
    log.write_text(start.format(16, 2, 0) + "step 1\n" * 5000 + start.format(8, 1, 1) + "step 2\n" * 5000)
    return run


def test_the_world_a_task_got_comes_from_its_done_marker_else_its_latest_start_line(tmp_path):
    run = _run_with_two_tasks(tmp_path)
    assert status.world(run, "train", 0, "11") == (24, 3)
    assert status.world(run, "train", 1, "12") == (8, 1)
    assert status.world(run, "train", 2, "13") == (None, None)  # not started: no log
    assert logs.last_match(run.log_path("train", "12"), status.STARTED, block=7)[1] == b"8"  # lines cut


def test_status_shows_the_world_size_and_nodes_in_the_table_and_the_json(tmp_path, capsys):
    run = _run_with_two_tasks(tmp_path)
    assert status_cmd.main([str(run.path), "--json"]) == 0
    rows = {r["task"]: r for r in json.loads(capsys.readouterr().out)}
    assert (rows["train[0]"]["world_size"], rows["train[0]"]["nodes"]) == (24, 3)
    assert (rows["train[1]"]["world_size"], rows["train[1]"]["nodes"]) == (8, 1)
    assert status_cmd.main([str(run.path)]) == 0
    summary, head, *rows = capsys.readouterr().out.splitlines()
    assert summary == "2 task(s): 1 UNKNOWN, 1 COMPLETED"  # a local job without its result file yet
    running, done = rows[:2]  # what needs a look first
    assert head.split()[5:7] == ["WORLD", "NODES"]
    assert done.split()[:7] == ["train[0]", "11", "COMPLETED", "0", "00:01:05", "24", "3"]
    at = head.index("WORLD")  # the running task has no elapsed time yet: read its columns by position
    assert running[at:].split()[:3] == ["8", "1", "step"]
