"""External LangSplat on the real local SLURM cluster, with the stand-ins of the real scripts.

    HPC_TEST_CLUSTER_DIR=/tmp/c python -m pytest tests/slurm/test_langsplat_external.py -m slurm

The whole graph of the DDP fork (preprocess, merge, ae_train, ae_encode, rgb, features as 2 nodes x
2 ranks, render, eval) runs as SLURM jobs chained by afterok on a small scene in the real on-disk
format; and a preempted RGB stage of upstream LangSplat (graphdeco's train.py) is requeued and
continues from its own chkpnt<N>.pth. The stand-ins hold at a given iteration until the test lets
them go (LANGSPLAT_STANDIN_HOLD), so the preemption lands at a known point.
"""
import json
import re
from datetime import datetime
from pathlib import Path

import pytest

from hpc import submit
from hpc.slurm.hostlist import expand
from hpc.rundir.run import RunDir
from tests.langsplat_standins.checkout import make_dim3
from tests.langsplat_standins.common import HOLD_ENV
from tests.slurm.test_langsplat import finished
from tests.slurm.test_pipeline import job_ids, wait_until
from tests.test_langsplat_external import overrides, world  # noqa: F401 - world is a fixture

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slurm
# Each stage's upstream stages, as external.stages() chains them.
AFTER = {"merge": {"preprocess"}, "ae_train": {"merge"}, "ae_encode": {"ae_train"}, "rgb": set(),
         "preprocess": set(), "features": {"ae_encode", "rgb"}, "render": set(), "eval": {"render"}}
PER_ITEM = {"render": "features"}  # each level waits only for that level's task of this stage (aftercorr)


@pytest.fixture(autouse=True)
def _root(monkeypatch):
    monkeypatch.chdir(ROOT)  # jobs import hpc and the stand-ins from the submission directory


def submit_external(world, run_dir: Path, checkout: str, *extra: str) -> RunDir:
    given = [o for o in overrides(world, checkout) if not o.startswith("cluster.kind=")]
    code = submit.main(["langsplat", "--profile", "sandbox", "--cluster", "slurm", "--run-dir", str(run_dir),
                        *given, "external.dist_backend=gloo", *extra])
    assert code == 0
    return RunDir(run_dir)


def submission_dependency(run: RunDir, stage: str, job_id: str) -> set:
    """The --dependency line of the sbatch script submitit wrote: its afterok job ids, and
    'aftercorr:<array id>' for a per-item wait."""
    script = (run.path / stage / "logs" / job_id.split("_")[0] / f"{job_id.split('_')[0]}_submission.sh")
    found = re.findall(r"^#SBATCH --dependency=(\S+)$", script.read_text(), re.M)
    terms = [t.partition(":") for t in found[0].split(",")] if found else []
    return {j if kind == "afterok" else f"{kind}:{j}" for kind, _, ids in terms for j in ids.split(":")}


def test_whole_fork_graph_runs_as_afterok_chained_jobs(slurm_cluster, world, tmp_path):  # noqa: F811
    run = submit_external(world, tmp_path / "run", "fork", "external.iterations=12", "external.checkpoint_every=4",
                          "external.ae_epochs=97", "external.images_per_shard=4")
    records = finished(run)
    ids = job_ids(run)
    assert sorted({stage for stage, _ in ids}) == sorted(AFTER)
    assert sorted(item for stage, item in ids if stage == "preprocess") == [0, 1]  # 6 images, 4 a shard
    for (stage, item), job_id in ids.items():
        upstream = {j for (s, i), j in ids.items() if s in AFTER[stage] or (s, i) == (PER_ITEM.get(stage), item)}
        assert set(run.dependencies()[job_id]) == upstream, stage
        given = {f"aftercorr:{j.split('_')[0]}" for j in upstream} if stage in PER_ITEM else upstream
        assert submission_dependency(run, stage, job_id) == given, stage  # what sbatch was given
        for before in upstream:
            assert datetime.fromisoformat(records[job_id].start) >= datetime.fromisoformat(records[before].end)
    # every output where the real scripts put it
    out, scene = run.path / "output", run.path / "scene" / "scene"
    assert len(list((scene / "language_features").glob("frame_*_[fs].npy"))) == 12
    assert len(list((scene / "language_features_dim3").glob("frame_*_[fs].npy"))) == 12
    assert (run.path / "autoencoder" / "ckpt" / "scene" / "best_ckpt.pth").is_file()
    assert (out / "scene_-1" / "chkpnt12.pth").is_file()  # the fork's train.py --no_include_feature
    for level in (1, 2, 3):
        record = json.loads((out / f"scene_{level}" / "standin.jsonl").read_text().splitlines()[0])
        # views on 4 ranks: --epochs round(12/6)=2 -> 2 x (6 // 4) = 2 updates, learning rate x 4
        assert (record["world_size"], record["iterations"], record["lr_scale"]) == (4, 2, 4)
        assert record["start_checkpoint"] == str(out / "scene_-1" / "chkpnt12.pth")
        assert (out / f"scene_{level}" / "chkpnt30000.pth").resolve() == out / f"scene_{level}" / "chkpnt2.pth"
        assert len(list((out / f"scene_{level}" / "train" / "ours_None" / "renders_npy").glob("*.npy"))) == 6
        assert expand(records[ids[("features", level)]].nodes) == ["n1", "n2"]  # 2 nodes x 2 ranks
    assert len(list((run.path / "eval" / "scene").glob("*.log"))) == 1


def test_preempted_rgb_stage_continues_from_its_own_checkpoint(slurm_cluster, world, tmp_path,  # noqa: F811
                                                               monkeypatch):
    from hpc.cluster.preempt import preempt

    make_dim3(world["data"])  # the dataset brings its features: preprocess and the autoencoder are skipped
    gate = tmp_path / "gate"
    gate.write_text("")
    monkeypatch.setenv(HOLD_ENV, f"10:{gate}")  # every stand-in run waits after iteration 10 while gate exists
    run = submit_external(world, tmp_path / "run", "upstream", "langsplat.levels=[1]", "external.iterations=20",
                          "external.checkpoint_every=10")
    job_id = job_ids(run)[("rgb", None)]
    model = run.path / "output" / "scene"  # graphdeco's train.py writes -m as given
    wait_until(lambda: Path(f"{gate}.reached").exists(), timeout_s=120, what="the RGB stage to reach iteration 10")
    assert (model / "chkpnt10.pth").is_file() and not (model / "chkpnt20.pth").exists()
    preempt(slurm_cluster, job_id)  # returns once SLURM has requeued the job
    gate.unlink()
    records = finished(run)
    assert records[job_id].restarts == 1
    runs = [json.loads(line) for line in (model / "standin.jsonl").read_text().splitlines()]
    assert [(r["start_iteration"], r["start_checkpoint"]) for r in runs] == [(1, None), (11, str(model / "chkpnt10.pth"))]
    assert (model / "chkpnt20.pth").is_file()
    level = json.loads((run.path / "output" / "scene_1" / "standin.jsonl").read_text().splitlines()[0])
    assert level["start_checkpoint"] == str(model / "chkpnt20.pth") and level["start_iteration"] == 1
    assert level["script"] == "train.py (upstream)" and runs[0]["script"] == "train.py (3dgs)"
    assert not {r["port"] for r in [*runs, level]} & {6009, 55555}  # each task binds a free GUI port
    assert len(list((run.path / "output" / "scene_1" / "train" / "ours_None" / "renders_npy").glob("*.npy"))) == 6
