"""Sweeps on the real local SLURM cluster: each stage is one array job across the points (one per
item of a point after its point's one task), a resubmission skips done points and resumes the
others, and a failed point holds back no other.

    python -m pytest tests/slurm/test_sweep.py -m slurm
"""
import json
import subprocess
import sys

import pytest

from hpc.sweep import grid
from hpc.slurm import scheduler
from hpc import submit
from hpc.monitor import status, sweeps
from hpc.rundir import sweepdir
from hpc.monitor import timeline
from tests.slurm.test_pipeline import ROOT, counting_path, tiny, wait_until  # noqa: F401 (tiny: autouse)

pytestmark = pytest.mark.slurm


@pytest.fixture
def calls(tmp_path, monkeypatch):
    """The log of every SLURM client this test runs (a PATH of counting wrappers)."""
    path, log = counting_path(tmp_path)
    monkeypatch.setenv("PATH", path)
    return log


def settled(sweep):
    """The rows, once no point is pending or running."""
    rows = sweeps.collect(sweep)
    return rows if rows and not any(r.state in scheduler.ACTIVE or r.state == sweeps.NOT_SUBMITTED
                                    for r in rows) else None


def sbatch_calls(log):
    return log.read_text().split().count("sbatch")


def array_ids(run):
    """stage -> the array job ids its tasks ran in."""
    out = {}
    for t in run.tasks():
        out.setdefault(t["stage"], set()).add(t["job_id"].split("_")[0])
    return out


def test_each_stage_is_one_array_and_a_resubmission_skips_done_points(slurm_cluster, tmp_path, calls, capsys):
    args = ["tiny", "--cluster", "slurm", "--run-dir", str(tmp_path / "sweep"), "tiny.parts=[0,1]"]
    assert submit.main([*args, "--sweep", "tiny.score=1,2"]) == 0
    # 2 points x (first + 2 second tasks): first's array, then second's item k of every point in an
    # array of its own, each task after its own point's first task (aftercorr pairs one id with one)
    assert sbatch_calls(calls) == 3
    sweep = sweepdir.SweepDir(tmp_path / "sweep")
    one, two = grid.points({"tiny.score": [1, 2]})
    rows = wait_until(lambda: settled(sweep), what="both points to end")
    assert [(r.point, r.state, r.tasks) for r in rows] == [(one.signature, "COMPLETED", "3/3"),
                                                            (two.signature, "COMPLETED", "3/3")]
    assert [r.metric.split()[1] for r in rows] == ["score=1", "score=2"]  # each point ran its own config
    first, second = array_ids(sweep.point(one.signature)), array_ids(sweep.point(two.signature))
    assert first == second and [len(first[s]) for s in ("first", "second")] == [1, 2]  # shared arrays
    # hpc.status on the sweep dir: one row per point from one scheduler call
    calls.write_text("")
    out = subprocess.run([sys.executable, "-m", "hpc.status", str(sweep.path)], capture_output=True, text=True,
                         cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert calls.read_text().split() == ["sacct"]
    assert f"{two.signature}  tiny.score=2  COMPLETED  3/3" in out.stdout, out.stdout
    # a new grid: point 1 leaves it (kept), point 2 is done, point 3 is new
    before = sweep.point(two.signature).manifest_path.read_bytes()
    calls.write_text("")
    capsys.readouterr()
    assert submit.main([*args, "--sweep", "tiny.score=2,3"]) == 0
    out = capsys.readouterr().out
    three = grid.points({"tiny.score": [3]})[0]
    assert f"point {one.signature} (tiny.score=1) is no longer in the grid" in out
    assert f"point {two.signature} tiny.score=2: done" in out and f"point {three.signature} tiny.score=3: new" in out
    assert sbatch_calls(calls) == 3 and "stage first: one array of 1 task(s) over 1 point(s)" in out
    assert sweep.point(two.signature).manifest_path.read_bytes() == before
    assert sweep.point(one.signature).is_done("second", 1)  # nothing of a removed point is deleted
    # once more while point 3 is queued or running: nothing to submit
    calls.write_text("")
    assert submit.main([*args, "--sweep", "tiny.score=2,3"]) == 0
    assert sbatch_calls(calls) == 0 and "nothing to submit" in capsys.readouterr().out
    rows = wait_until(lambda: settled(sweep), what="point 3 to end")
    assert {r.point: r.state for r in rows if r.in_grid} == {two.signature: "COMPLETED", three.signature: "COMPLETED"}
    assert [r.in_grid for r in rows] == [False, True, True]
    # its picture: one row per point, a lane per task, one attempt each
    picture = timeline.collect(str(sweep.path))
    assert [r.label.split()[0] for r in picture] == [one.signature, two.signature, three.signature]
    assert [[sum(bool(s.gid) for s in lane.segments) for lane in r.lanes] for r in picture] == [[1, 1, 1]] * 3


def test_a_failed_point_holds_back_no_other_and_is_resubmitted(slurm_cluster, tmp_path, calls, capsys):
    args = ["tiny", "--cluster", "slurm", "--run-dir", str(tmp_path / "sweep"), "tiny.parts=[0]"]
    assert submit.main([*args, "--sweep", "tiny.fail_first=false,true"]) == 0
    sweep = sweepdir.SweepDir(tmp_path / "sweep")
    good, bad = grid.points({"tiny.fail_first": [False, True]})
    rows = wait_until(lambda: settled(sweep), what="both points to end")
    # its second task waits on its own first task only (aftercorr), which failed: it never starts
    assert [r.state for r in rows] == ["COMPLETED", "NEVER"]
    tasks = {t.task: t for t in status.collect(sweep.point(bad.signature))}
    assert tasks["first"].state == "FAILED" and tasks["second[0]"].state == "NEVER"
    assert not (sweep.point(bad.signature).task_dir("second", 0) / "out-0.txt").exists()
    # resubmitted without --sweep: the recorded grid; the good point is skipped
    calls.write_text("")
    capsys.readouterr()
    assert submit.main(["tiny", "--run-dir", str(sweep.path)]) == 0
    out = capsys.readouterr().out
    assert f"point {good.signature} tiny.fail_first=false: done" in out
    assert f"point {bad.signature} tiny.fail_first=true: resume: 2 of 2 task(s) to submit" in out
    assert sbatch_calls(calls) == 2
    manifest = json.loads(sweep.point(bad.signature).manifest_path.read_text())
    assert len(manifest["tasks"]["first"]["jobs"]) == 2  # both attempts are kept
    wait_until(lambda: settled(sweep), what="the resubmitted point to end")


def test_cancelling_a_sweep_dir_cancels_every_points_jobs(slurm_cluster, tmp_path, calls):
    args = ["tiny", "--cluster", "slurm", "--run-dir", str(tmp_path / "sweep"), "tiny.parts=[0]",
            "tiny.sleep_s=600"]
    assert submit.main([*args, "--sweep", "tiny.score=1,2"]) == 0
    sweep = sweepdir.SweepDir(tmp_path / "sweep")
    jobs = {jid for sig in sweep.record()["points"] for jid in sweep.point(sig).slurm_jobs()}
    assert len({j.split("_")[0] for j in jobs}) == 2  # one array per stage, shared by both points
    calls.write_text("")
    out = subprocess.run([sys.executable, "-m", "hpc.cancel", str(sweep.path)], capture_output=True, text=True,
                         cwd=ROOT)
    assert out.returncode == 0 and out.stdout.startswith("cancelled: "), out.stderr
    assert calls.read_text().split().count("scancel") == 1, (out.stdout, calls.read_text())
    arrays = ",".join(sorted({j.split("_")[0] for j in jobs}))
    wait_until(lambda: not subprocess.run(["squeue", "-h", "-o", "%i", "-j", arrays], capture_output=True,
                                          text=True).stdout.strip(), 30, "no job of the sweep left in the queue")
