"""Pure parts of hpc.status: progress read from real tqdm output, the table."""
from pathlib import Path

import pytest
from tqdm import tqdm

from hpc import status


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
    table = status.format_table([row, ended])
    assert "164/300" in table.splitlines()[1] and "no accounting" in table.splitlines()[2]
