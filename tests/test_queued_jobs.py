"""A job queued before hpc's modules moved still runs after the move.

submitit pickles each job when it is submitted and unpickles it when the job starts, and again after
every requeue: a job queued under one version of hpc may start under the next. The pickle in
tests/golden/pickles/ was written by `DelayedSubmission(StageTask(...)).dump(...)` with hpc 0.1.0's
module names (hpc.pipeline.executor.StageTask, hpc.rundir.snapshot.JobCode); here it is loaded and run the way
submitit's job runner does (DelayedSubmission.load, then result()), in a fresh interpreter.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

GOLDEN = Path(__file__).parent / "golden" / "pickles" / "stage-task-0.1.0.pkl"
STAGE = '''
import json, os
from pathlib import Path

def first(ctx):
    Path(ctx.stage_dir, "out.txt").write_text(json.dumps(
        {"stage": ctx.stage, "cfg": ctx.cfg, "cwd": os.getcwd(), "code": os.environ["HPC_CODE_DIR"],
         "run_id": os.environ["HPC_RUN_ID"]}))
    return 7
'''
LOAD = "from submitit.core.utils import DelayedSubmission as D; D.load(%r).result()"


def test_a_stage_task_pickled_before_the_move_runs(tmp_path: Path) -> None:
    # What the pickle names: run dir "run", its snapshot run/code/0123abcd holding module pickled_stage.
    snapshot = tmp_path / "run" / "code" / "0123abcd"
    snapshot.mkdir(parents=True)
    (snapshot / "pickled_stage.py").write_text(STAGE)
    (tmp_path / "run" / "config.yaml").write_text("answer: 42\n")
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith(("SLURM_", "SUBMITIT_"))}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[1])
    done = subprocess.run([sys.executable, "-c", LOAD % str(GOLDEN)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    out = json.loads((tmp_path / "run" / "first" / "out.txt").read_text())
    assert out["cfg"] == {"answer": 42} and out["run_id"] == "pickled-0001"
    assert out["code"] == "run/code/0123abcd"  # the task imported its target from the snapshot
    marker = json.loads((tmp_path / "run" / "first" / "done").read_text())
    assert marker["result"] == 7
