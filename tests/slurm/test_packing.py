"""Packed stages on the real local SLURM cluster: planned against the partition's GPUs per node as
sinfo reports them, and refused at submission before any sbatch (the job side that runs each item
as its own srun step is not built yet: docs/pipelines.md).

    python -m pytest tests/slurm/test_packing.py -m slurm
"""
from pathlib import Path

import pytest

from hpc import submit
from hpc.pipeline import plan
from hpc.slurm import gres

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slurm


@pytest.fixture(autouse=True)
def tiny(monkeypatch):
    monkeypatch.setitem(plan.PIPELINES, "tiny", "tests.tiny_pipeline")
    monkeypatch.chdir(ROOT)


def test_a_packed_stage_is_planned_on_the_partitions_gpus_and_refused_before_any_sbatch(slurm_cluster, tmp_path,
                                                                                       capsys):
    gpus = slurm_cluster.layout.gpus_per_node
    assert gres.node_gpus("low") == gres.node_gpus(None) == gpus  # low is the sandbox's default partition
    run = tmp_path / "r"
    args = ["tiny", "--cluster", "slurm", "--run-dir", str(run), "--no-snapshot", "tiny.parts=[0,1,2,3,4]",
            "stages.second.gpus_per_node=1"]
    assert submit.main([*args, f"stages.second.pack={gpus + 1}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: stages.second.pack={gpus + 1}: {gpus + 1} items x 1 GPU(s) = {gpus + 1} GPUs per job; "
                   f"partition (default) has {gpus} GPUs per node. HINT: stages.second.pack={gpus} or less."]
    assert submit.main([*args, f"stages.second.pack={gpus}"]) == 2
    err = capsys.readouterr().err
    assert "packed jobs cannot be submitted yet" in err and "HINT: submit with stages.second.pack=1" in err
    assert not (run / "manifest.json").exists()  # refused before the run was started: nothing queued
