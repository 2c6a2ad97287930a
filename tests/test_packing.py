"""Packing small items onto big allocations (stages.X.pack): groups, the job's size, what does not
fit, per-item waits across packed stages, the dry run that shows which items share which job.

    python -m pytest tests/test_packing.py
"""
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from hpc.config import schema as config
from hpc.config.checks import ConfigError
from hpc.pipeline import packing, plan
from hpc.slurm import gres

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = Path(__file__).parent / "golden" / "packing"
SIXTEEN = "tiny.parts=[" + ",".join(map(str, range(16))) + "]"
ONE_GPU = ["stages.second.gpus_per_node=1", "stages.second.mem=4G", "stages.second.cpus_per_task=2"]


@pytest.fixture(autouse=True)
def tiny(monkeypatch):
    monkeypatch.setitem(plan.PIPELINES, "tiny", "tests.tiny_pipeline")


def make(*overrides, finished=frozenset(), queued=None, node_gpus=8, kind="slurm"):
    pipe = plan.get_pipeline("tiny")
    cfg = config.load(pipe.schema, "tiny", None, list(overrides))
    return plan.make_plan(pipe, cfg, "/r", kind, frozenset(finished), queued or {},
                          node_gpus=lambda partition: node_gpus)


def jobs(p):
    return {j.label: j for j in p.jobs}


def test_sixteen_one_gpu_items_packed_eight_per_job_are_two_jobs_of_eight_gpus():
    second = jobs(make(SIXTEEN, *ONE_GPU, "stages.second.pack=8"))["second"]
    assert second.groups == (tuple(range(8)), tuple(range(8, 16))) and second.items == tuple(range(16))
    text = second.sbatch_text()
    for line in ("#SBATCH --array=0-1%2", "#SBATCH --gpus-per-node=8", "#SBATCH --ntasks-per-node=8",
                 "#SBATCH --mem=32G", "#SBATCH --cpus-per-task=2"):
        assert line in text
    unpacked = jobs(make(SIXTEEN, *ONE_GPU))["second"]
    assert "#SBATCH --array=0-15%16" in unpacked.sbatch_text() and not unpacked.groups


def test_the_last_group_holds_the_rest_and_a_resubmission_packs_only_what_is_left():
    p = make("tiny.parts=[0,1,2,3,4,5,6,7,8,9]", *ONE_GPU, "stages.second.pack=4",
             finished={("first", None), ("second", 0), ("second", 5)})
    assert jobs(p)["second"].groups == ((1, 2, 3, 4), (6, 7, 8, 9))


@pytest.mark.parametrize("overrides, node_gpus, seen", [
    (["stages.second.pack=16"], 8, "stages.second.pack=16: 16 items x 1 GPU(s) = 16 GPUs per job; partition "
                                   "(default) has 8 GPUs per node. HINT: stages.second.pack=8 or less."),
    (["stages.second.pack=2", "cluster.min_job_gpus=8"], 8,
     "the site's minimum job size is 8 GPUs (cluster.min_job_gpus). HINT: stages.second.pack=8 or more."),
    (["stages.first.pack=4"], 8, "stages.first.pack=4 on a stage that is no array"),
    (["stages.second.pack=2", "stages.second.nodes=2"], 8, "expected one-node items"),
    (["stages.second.pack_fail=maybe"], 8, "expected one of ['continue', 'stop']"),
    (["stages.second.pack=0"], 8, "expected 1 or more items per job"),
])
def test_a_pack_that_does_not_fit_is_refused_with_the_numbers(overrides, node_gpus, seen):
    with pytest.raises(ConfigError) as err:
        make(SIXTEEN, *ONE_GPU, *overrides, node_gpus=node_gpus)
    assert seen in str(err.value) and "HINT:" in str(err.value) and "\n" not in str(err.value)


def test_a_packed_item_in_a_container_runs_its_ranks_in_it_as_an_unpacked_jobs_srun_line_does():
    from hpc.pipeline import packrun

    box = ["stages.second.container.runtime=exec", "stages.second.container.prefix=[env, X=1]"]
    second = jobs(make(SIXTEEN, *ONE_GPU, "stages.second.pack=8", *box))["second"]
    shape = packing.item_shape(second.resources)
    argv = packrun.item_argv(shape, 3, "/r/p.pkl", "/r/log")
    assert argv[0] == "srun" and "--gres=gpu:1" in argv and argv[-6:] == ["-u", "-m", "hpc.pipeline.packrun", "--item",
                                                                          "3", "/r/p.pkl"]
    assert argv[argv.index("env"):-6] == shlex.split(second.python), argv  # the job's own interpreter text
    assert shape["srun_args"] == [] and "env X=1" in shape["python"]


def test_partition_gpus_unknown_is_said_and_local_executors_run_items_one_by_one():
    p = make(SIXTEEN, *ONE_GPU, "stages.second.pack=8", node_gpus=None)
    assert any("not checked against the partition's GPUs per node" in n for n in p.notes)
    local = make(SIXTEEN, *ONE_GPU, "stages.second.pack=8", kind="local")
    assert not jobs(local)["second"].groups
    assert "stages.second.pack=8: the local executor runs the items one by one" in local.notes
    with pytest.raises(ConfigError, match="stages.second.pack=0; expected 1 or more"):
        make(SIXTEEN, "stages.second.pack=0", kind="local")


def test_an_item_waiting_on_a_packed_stage_waits_on_the_task_holding_its_item():
    p = make("tiny.parts=[0,1,2,3,4,5]", "tiny.follow=true", "stages.second.pack=3")
    follow = [j for j in p.jobs if j.stage == "follow"]
    # one array per position in a group: each pairs its task ids with the groups' (aftercorr)
    assert [(j.items, j.waits) for j in follow] == [((0, 3), (("second", 0), ("second", 1))),
                                                   ((1, 4), (("second", 0), ("second", 1))),
                                                   ((2, 5), (("second", 0), ("second", 1)))]
    assert follow[1].item_dependency({"second": ["40_0", "40_1"]}) == ("aftercorr:40", [["40_0"], ["40_1"]])
    assert any("3 arrays, as several of its tasks wait on one second task" in n for n in p.notes)


def test_packed_items_waiting_on_unpacked_tasks_wait_afterok_on_each():
    p = make("tiny.parts=[0,1,2,3,4]", "tiny.follow=true", "stages.follow.pack=3")
    follow = [j for j in p.jobs if j.stage == "follow"]
    assert [j.groups for j in follow] == [((0, 1, 2),), ((3, 4),)]
    assert "#SBATCH --dependency='afterok:<second_0>:<second_1>:<second_2>'" in follow[0].sbatch_text()
    assert follow[1].item_dependency({"second": [f"50_{t}" for t in range(5)]}) == (
        "afterok:50_3:50_4", [["50_3", "50_4"]])


def test_two_stages_packed_alike_pair_their_groups_by_aftercorr():
    p = make("tiny.parts=[0,1,2,3,4,5,6,7]", "tiny.follow=true", "stages.second.pack=4", "stages.follow.pack=4")
    follow = jobs(p)["follow"]
    assert follow.groups == ((0, 1, 2, 3), (4, 5, 6, 7)) and follow.waits == (("second", 0), ("second", 1))
    assert "#SBATCH --dependency='aftercorr:<second>'" in follow.sbatch_text()
    # second's group 1 still queued as task 1 of job 12: follow's group 1 waits on that task alone
    q = make("tiny.parts=[0,1,2,3,4,5,6,7]", "tiny.follow=true", "stages.second.pack=4", "stages.follow.pack=4",
             finished={("first", None), *(("second", i) for i in range(4)), *(("follow", i) for i in range(4))},
             queued={("second", i): "12_1" for i in range(4, 8)})
    assert jobs(q)["follow"].item_dependency() == ("afterok:12_1", [["12_1"]])


def test_sinfo_gres_gives_each_partition_its_largest_node():
    text = "gpu* gpu:8\ngpu* gpu:a100:4(S:0-1)\nbig gpu:h100:8(S:0-1),shard:16\ncpu (null)\n"
    assert gres.parse(text) == {"gpu": 8, "": 8, "big": 8, "cpu": 0}


def test_a_packed_jobs_batch_script_runs_the_packs_driver_told_one_items_shape():
    second = jobs(make(SIXTEEN, *ONE_GPU, "stages.second.pack=8"))["second"]
    params = second.executor_parameters(tasks="/r/second/logs/tasks-x.bin")
    setup = params["setup"]
    assert any(line.startswith("srun() {") and "-m hpc.pipeline.packrun /r --tasks /r/second/logs/tasks-x.bin -- "
               in line for line in setup) and not any("hpc.afterstep /r" in line for line in setup)
    shape = json.loads(shlex.split(next(x for x in setup if x.startswith("export HPC_PACK=")))[1].split("=", 1)[1])
    assert shape == {"gpus": 1, "ranks": 1, "cpus": 2, "mem": "4G", "fail": "continue"}
    assert "-m hpc.pipeline.packrun /r" in second.sbatch_text()  # the dry run shows what sbatch gets
    unpacked = jobs(make(SIXTEEN, *ONE_GPU))["second"].executor_parameters()
    assert any("-m hpc.afterstep /r" in line for line in unpacked["setup"]) and "HPC_PACK" not in str(unpacked)


def test_dry_run_shows_which_items_share_which_job():
    cmd = [sys.executable, "-m", "hpc.submit", "tests.tiny_pipeline", "--dry-run", "--run-dir", "/RUN",
           "--cluster", "slurm", "--no-snapshot", "cluster.partitions=[debug]", SIXTEEN, *ONE_GPU, "stages.second.pack=8",
           "tiny.follow=true"]
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env={**os.environ, "SLURM_CONF": "/nonexistent"})
    assert out.returncode == 0, out.stderr
    text = out.stdout.replace(shlex.quote(sys.executable), "PYTHON").replace(str(ROOT), "CHECKOUT")
    path = GOLDEN / "tiny_pack8.txt"
    if os.environ.get("HPC_UPDATE_GOLDEN"):
        path.write_text(text)
    assert text == path.read_text()


def run_dry(tmp_path, *args):
    (tmp_path / "train.py").write_text("print(1)\n")
    cmd = [sys.executable, "-m", "hpc.submit", "run", "--cluster", "slurm", "--profile", "sandbox", "--dry-run",
           "--no-snapshot", "--run-dir", str(tmp_path / "r"), "--nodes", "1", "--gpus-per-node", "1", *args,
           "--", "python", "train.py"]
    env = {**os.environ, "SLURM_CONF": "/nonexistent", "PYTHONPATH": str(ROOT)}
    return subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, env=env)


def test_run_pack_packs_the_points_of_a_sweep(tmp_path):
    out = run_dry(tmp_path, "--sweep", "script.env.X=1,2,3,4,5", "--pack", "2")
    assert out.returncode == 0, out.stderr
    assert "stage main#1: one array of 2 task(s) over 4 point(s), 1 rank(s) per point" in out.stdout
    assert "stage main#2: one array of 1 task(s) over 1 point(s), 1 rank(s) per point" in out.stdout
    assert out.stdout.count("side by side (stages.main.pack)") == 3
    full, last = out.stdout.split("# ---- sbatch script: stage main#2 ----")
    for line in ("#SBATCH --array=0-1%2", "#SBATCH --gpus-per-node=2", "#SBATCH --ntasks-per-node=2"):
        assert line in full
    for line in ("#SBATCH --gpus-per-node=1", "#SBATCH --ntasks-per-node=1"):  # the last point asks for itself
        assert line in last


def test_a_last_group_smaller_than_k_is_a_job_asking_for_what_it_holds():
    p = make("tiny.parts=[0,1,2,3,4,5,6,7,8,9]", *ONE_GPU, "stages.second.pack=4")
    full, last = jobs(p)["second#1"], jobs(p)["second#2"]
    assert full.groups == ((0, 1, 2, 3), (4, 5, 6, 7)) and last.groups == ((8, 9),)
    for line in ("#SBATCH --array=0-1%2", "#SBATCH --gpus-per-node=4", "#SBATCH --ntasks-per-node=4", "#SBATCH --mem=16G"):
        assert line in full.sbatch_text()
    for line in ("#SBATCH --gpus-per-node=2", "#SBATCH --ntasks-per-node=2", "#SBATCH --mem=8G"):
        assert line in last.sbatch_text()
    assert packing.item_shape(last.resources) == packing.item_shape(full.resources)  # each item's step alike
    # the site's minimum job size still holds: the last job asks at least that many GPUs
    sized = jobs(make("tiny.parts=[0,1,2,3,4,5,6,7,8,9]", *ONE_GPU, "stages.second.pack=4", "cluster.min_job_gpus=3"))
    assert sized["second#2"].resources["gpus_per_node"] == 3 and sized["second#1"].resources["gpus_per_node"] == 4
    assert packing.item_shape(sized["second#2"].resources)["gpus"] == 1


def test_run_pack_without_a_sweep_is_refused_in_one_line(tmp_path):
    out = run_dry(tmp_path, "--pack", "2")
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.strip().splitlines() == ["error: stages.main.pack=2 on a stage that is no array; expected pack "
                                               "only on a stage with items. HINT: drop stages.main.pack."]


def test_the_benchmark_counts_8_jobs_and_8_node_hours_packed_against_64_unpacked():
    from bench import packing as bench_packing

    sec = bench_packing.run(None)
    assert [row[:4] for row in sec.rows] == [["pack=1 (one item per job)", "64", "1", "64"], ["pack=8", "8", "1", "8"]]
    assert all(met for _, met in sec.verdicts)


def test_a_packed_stage_under_cluster_here_runs_each_item_as_its_own_step_up_to_k_per_node(tmp_path, monkeypatch,
                                                                                             capsys):
    from hpc.here import alloc as herealloc
    from hpc.here.backend import Here
    from hpc.pipeline import submission
    from hpc.pipeline.request import Request

    monkeypatch.chdir(ROOT)
    alloc = herealloc.Allocation("7", nodes=2, cpus_per_node=8, gpus_per_node=4)
    req = Request("tests.tiny_pipeline", ("tiny.parts=[0,1,2,3,4,5]", "stages.second.gpus_per_node=1",
                                          "stages.second.pack=3"), cluster="here", run_dir=str(tmp_path / "r"),
                  no_snapshot=True, dry_run=True)
    submission.start(req, backends={"here": lambda kind, setup: Here(kind, setup, alloc=alloc)})
    out = capsys.readouterr().out
    assert "stages.second.pack=3: inside the allocation each item is its own step of its own GPUs, up to 3 side " \
           "by side on a node" in out
    line = next(x for x in out.splitlines() if "stage second:" in x and "srun" in x)
    assert "--gpus-per-node=1 " in line and "--ntasks=1 " in line and line.endswith("(6 task(s) side by side)"), line
    job = next(j for j in make("tiny.parts=[0,1,2,3,4,5]", *ONE_GPU, "stages.second.pack=3").jobs if j.groups)
    item = packing.unpacked(job)
    assert not item.groups and item.items == job.items and item.resources["gpus_per_node"] == 1
    assert herealloc.width(item, herealloc.Allocation("7", nodes=1, cpus_per_node=4, gpus_per_node=8)) == 2  # CPUs


def test_a_packed_sweep_dry_run_names_each_points_item_its_array_task_runs():
    cmd = [sys.executable, "-m", "hpc.submit", "tests.tiny_pipeline", "--dry-run", "--run-dir", "/SWEEP", "--cluster",
           "slurm", "--no-snapshot", "cluster.partitions=[debug]", "tiny.parts=[0,1]", "stages.second.gpus_per_node=1",
           "stages.second.pack=2", "--sweep", "tiny.score=1,2"]
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env={**os.environ, "SLURM_CONF": "/nonexistent"})
    assert out.returncode == 0, out.stderr
    runs = re.findall(r"array task (\d): points (\w+)\[0\] (\w+)\[1\] side by side \(stages.second.pack\)",
                      out.stdout)
    assert [t for t, _, _ in runs] == ["0", "1"] and all(a == b for _, a, b in runs), out.stdout  # a point's items
