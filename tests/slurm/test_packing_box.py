"""A packed stage in a container on the real local SLURM cluster: the `exec` runtime under bubblewrap
(tests/box.py), where the ranks see no SLURM client and import hpc from the copy hpc carries in. The
pack's driver runs in the batch step on the host; each item's step runs its ranks in the box.

    python -m pytest tests/slurm/test_packing_box.py -m slurm
"""
import json
from pathlib import Path

import pytest

from hpc import submit
from hpc.rundir.run import RunDir
from tests.box import boxed
from tests.slurm.pipelines import use_pipelines
from tests.slurm.requeue_helpers import wait_for
from tests.slurm.test_packing import ended

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slurm
pipelines = use_pipelines(pk="tests.pack_pipeline")


def test_two_items_packed_in_a_container_run_as_their_own_steps_inside_it(slurm_cluster, tmp_path):
    run = RunDir(tmp_path / "r")
    assert submit.main(["pk", "--cluster", "slurm", "--run-dir", str(run.path), *boxed(), "pk.chain=true",
                        "pk.parts=[0,1]", "pk.steps=3", "pk.step_s=0", "stages.train.pack=2"]) == 0
    jobs = {t["item"]: t["job_id"] for t in run.tasks()}
    assert jobs[0] == jobs[1]  # one job
    wait_for(lambda: ended(run), "the packed job to end", timeout=180)
    assert run.is_done("train", 0) and run.is_done("train", 1)
    for item in (0, 1):  # each item's rank in the box: hpc from the carried copy, not the checkout
        lines = (run.task_dir("train", item) / "attempts.jsonl").read_text().splitlines()
        (attempt,) = [json.loads(line) for line in lines]
        assert not attempt["hpc"].startswith(str(ROOT)), attempt
