"""What a sweep's submission and its tasks' look-ups cost per point, counted, not timed: manifest
reads and writes, config renders, and the files hpc.afterstep opens to find a task's point.

    python -m pytest tests/test_sweep_scale.py -q

SLURM's clients are stand-ins on PATH (sbatch keeps each script it is given and answers a job id;
sacct and squeue know no job), so the submission runs whole without a cluster; the sweep on a
real cluster is tests/slurm/test_sweep.py.
"""
import collections
import os
import shlex
from pathlib import Path

import pytest

from hpc import submit
from hpc.config import schema as hconfig
from hpc.pipeline import plan, submission
from hpc.rundir import sweepdir

FAKES = {
    "sbatch": 'n=$(($(cat "$HPC_FAKE/n" 2>/dev/null || echo 100) + 1)); echo $n > "$HPC_FAKE/n"\n'
              'cp "$1" "$HPC_FAKE/script-$n.sh"; echo "Submitted batch job $n"\n',
    "scontrol": 'echo "MaxArraySize = 1001"\n',
    "sacct": "true\n",
    "squeue": "true\n",
}
ARGS = ["tests.tiny_pipeline", "--cluster", "slurm", "cluster.partitions=[low]", "run.snapshot=false",
        "tiny.parts=[0,1]"]


@pytest.fixture
def fake_slurm(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in FAKES.items():
        (bin_dir / name).write_text("#!/bin/bash\n" + body)
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("HPC_FAKE", str(bin_dir))
    monkeypatch.setitem(plan.PIPELINES, "tiny", "tests.tiny_pipeline")
    return bin_dir


@pytest.fixture
def counted(monkeypatch):
    """Counters of manifest reads and writes per directory, and of config renders."""
    seen = collections.Counter()
    read, write, render = Path.read_bytes, os.replace, hconfig.to_yaml

    def read_bytes(self):
        seen["read", self.parent.name] += self.name == "manifest.json"
        return read(self)

    def replace(src, dst, *a, **k):
        seen["write", Path(dst).parent.name] += Path(dst).name == "manifest.json"
        return write(src, dst, *a, **k)

    def to_yaml(cfg):
        seen["render", ""] += 1
        return render(cfg)

    monkeypatch.setattr(Path, "read_bytes", read_bytes)
    monkeypatch.setattr(os, "replace", replace)
    monkeypatch.setattr(hconfig, "to_yaml", to_yaml)
    return seen


def _sweep(tmp_path, scores, sleeps):
    return submit.main([*ARGS, "--run-dir", str(tmp_path / "s"), "--sweep",
                        "tiny.score=" + ",".join(map(str, scores)), "tiny.sleep_s=" + ",".join(map(str, sleeps))])


def test_each_point_is_written_once_and_configs_are_not_rendered_per_point(tmp_path, fake_slurm, counted, capsys):
    assert _sweep(tmp_path, range(6), range(4)) == 0, capsys.readouterr().err
    sweep = sweepdir.SweepDir(tmp_path / "s")
    points = list(sweep.record()["points"])
    assert len(points) == 24
    writes = {sig: counted["write", sig] for sig in points}
    assert set(writes.values()) == {1}, writes  # one manifest write per point, not one per stage
    assert sum(counted["read", sig] for sig in points) == 0  # new points: nothing to read
    assert counted["render", ""] < len(points) / 2, counted["render", ""]  # a render per section, not per point
    for sig in points:  # and what was written is whole: every task of the point, its config
        assert len(sweep.point(sig).tasks()) == 3
        assert "score:" in sweep.point(sig).config_path.read_text()
    # a resubmission with new points reads each old point's manifest once and writes only the new ones
    counted.clear()
    assert _sweep(tmp_path, range(6), range(5)) == 0, capsys.readouterr().err
    new = [sig for sig in sweep.record()["points"] if sig not in points]
    assert len(new) == 6
    assert max(counted["read", sig] for sig in points) == 1, counted
    assert {sig for (what, sig), n in counted.items() if what == "write" and n} == set(new)
    assert {counted["write", sig] for sig in new} == {1}


def test_a_points_config_yaml_is_what_to_yaml_writes_for_its_config(tmp_path, fake_slurm, capsys):
    """The template path of hpc.sweep.points.texts: numbers made floats by the schema, strings that
    YAML must quote."""
    assert submit.main([*ARGS, "--run-dir", str(tmp_path / "s"), "--sweep", "tiny.score=1,2.5",
                        "tiny.release_file=x,'1',true,a:b"]) == 0, capsys.readouterr().err
    sweep = sweepdir.SweepDir(tmp_path / "s")
    from omegaconf import OmegaConf

    base = submission.build(submit.parse_args([*ARGS, "--run-dir", str(tmp_path / "x")]), view=False)[1]
    for sig, entry in sweep.record()["points"].items():
        cfg = OmegaConf.merge(base, {})
        for key, value in entry["overrides"].items():
            OmegaConf.update(cfg, key, value, merge=False)
        assert sweep.point(sig).config_path.read_text() == hconfig.to_yaml(cfg), entry


def test_a_sweep_task_finds_its_point_in_one_file_whatever_the_number_of_points(tmp_path, fake_slurm, capsys,
                                                                                 monkeypatch):
    """hpc.afterstep in a sweep's array: the batch script names the array's points file, and the
    look-up reads it alone, no point's manifest."""
    assert _sweep(tmp_path, range(10), range(3)) == 0, capsys.readouterr().err
    sweep = sweepdir.SweepDir(tmp_path / "s")
    opened = []
    real_open = open

    def counting_open(path, *a, **k):
        opened.append(str(path))
        return real_open(path, *a, **k)

    for script in sorted(fake_slurm.glob("script-*.sh")):
        job = script.stem.split("-")[1]
        line = next(ln for ln in script.read_text().splitlines() if ln.startswith("srun() {"))
        words = shlex.split(line[len("srun() {"):].rstrip("; }"))
        args = words[words.index("hpc.afterstep") + 1:]
        assert args[1] == "--points", line
        points = args[2]
        for point in sweep.record()["points"]:
            for task in sweep.point(point).tasks():
                if task["job_id"].split("_")[0] != job:
                    continue
                opened.clear()
                monkeypatch.setattr("builtins.open", counting_open)
                monkeypatch.setattr(Path, "read_bytes", lambda self: pytest.fail(f"read {self}"))
                found = sweepdir.run_for(args[0], task["job_id"], points)
                monkeypatch.undo()
                assert found.path == sweep.point(point).path
                assert opened == [points]


def test_an_array_writes_one_file_of_its_tasks_pickles_and_each_task_unpacks_its_own(tmp_path, fake_slurm, capsys,
                                                                                    monkeypatch):
    """submitit writes one pickle file per task at submission (here 3 per point); an array writes one
    file of its tasks' pickles instead, which its batch script names to hpc.afterstep (--tasks), and a
    point gets only its config.yaml and manifest. A task's batch step unpacks its own pickle where
    submitit's runner reads it, and leaves a pickle already there as it is (a requeue after
    checkpoint() wrote the next one)."""
    from submitit.core.utils import DelayedSubmission

    from hpc import afterstep

    assert _sweep(tmp_path, range(6), range(4)) == 0, capsys.readouterr().err
    sweep = sweepdir.SweepDir(tmp_path / "s")
    scripts = sorted(fake_slurm.glob("script-*.sh"))
    assert len(scripts) == 3  # first, and second's two items (aftercorr)
    assert sorted(p.name for p in sweep.path.rglob("*.pkl")) == []  # no pickle per task at submission
    assert len(list(sweep.path.rglob("tasks-*.bin"))) == len(scripts)  # one file per array
    for sig in sweep.record()["points"]:  # per point, its two records: its logs are linked by its tasks
        assert sorted(os.listdir(sweep.point(sig).path)) == ["config.yaml", "manifest.json"]
    from hpc.pipeline import arraytasks  # (what unpacks a task's pickle)
    (fake_slurm / "srun").write_text('#!/bin/bash\necho "$@" >> "$HPC_FAKE/srun.log"\n')
    (fake_slurm / "srun").chmod(0o755)
    tasks = {t["job_id"]: (sig, t) for sig in sweep.record()["points"] for t in sweep.point(sig).tasks()}
    for script in scripts:
        line = next(ln for ln in script.read_text().splitlines() if ln.startswith("srun() {"))
        words = shlex.split(line[len("srun() {"):].rstrip("; }"))
        args = words[words.index("hpc.afterstep") + 1:]
        packed = args[args.index("--tasks") + 1]
        job = script.stem.split("-")[1]
        mine = {jid: v for jid, v in tasks.items() if jid.split("_")[0] == job}
        assert len(mine) == 24
        for jid, (sig, task) in mine.items():
            env = {"SLURM_ARRAY_JOB_ID": job, "SLURM_ARRAY_TASK_ID": jid.split("_")[1]}
            delayed = DelayedSubmission.load(arraytasks.unpack(packed, env))
            stage_task = delayed.function
            assert (stage_task.run_dir, stage_task.stage, stage_task.item) == \
                (str(sweep.point(sig).path), task["stage"], task["item"])
        # through hpc.afterstep, as the batch script runs it: unpacked before srun runs
        first = sorted(mine)[0]
        target = Path(arraytasks.unpack(packed, {"SLURM_ARRAY_JOB_ID": job,
                                                 "SLURM_ARRAY_TASK_ID": first.split("_")[1]}))
        target.unlink()
        for name, value in zip(("SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID"), first.split("_")):
            monkeypatch.setenv(name, value)
        assert afterstep.main([*args[:args.index("--") + 1], "echo", "ran"]) == 0
        assert target.is_file() and "ran" in (fake_slurm / "srun.log").read_text()
        target.write_bytes(b"checkpointed")  # what checkpoint() would have written before a requeue
        assert afterstep.main([*args[:args.index("--") + 1], "echo", "ran"]) == 0
        assert target.read_bytes() == b"checkpointed"


def test_each_distinct_swept_value_is_type_checked_once_not_once_per_point(tmp_path, fake_slurm, capsys, monkeypatch):
    """The points' stages are read from read-only views over the base's plain data: OmegaConf
    checks each distinct (key, value) once for the stages and once for config.yaml's text (2 x (6 + 4)
    here), not each point's every key (2 x 24 and more)."""
    from omegaconf import OmegaConf

    calls = []
    real = OmegaConf.update
    monkeypatch.setattr(OmegaConf, "update", lambda cfg, key, *a, **k: calls.append(key) or real(cfg, key, *a, **k))
    assert _sweep(tmp_path, range(6), range(4)) == 0, capsys.readouterr().err
    swept = [k for k in calls if k in ("tiny.score", "tiny.sleep_s")]
    assert len(swept) <= 2 * (6 + 4), len(swept)
    sweep = sweepdir.SweepDir(tmp_path / "s")
    assert all(len(sweep.point(sig).tasks()) == 3 for sig in sweep.record()["points"])
