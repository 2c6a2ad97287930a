"""Users' unmodified scripts under `python -m hpc.submit run`, one per framework, each preempted once
by a real SLURM preemption on the local cluster: every job ends COMPLETED after one requeue, its second
attempt resumed from the first one's checkpoint, it reached the requested step, it was never restarted
in place (a rank that dies at interpreter exit after its work, as gloo's teardown makes one now and
then, counts as a normal end: hpc.scripts.scriptexit), and nothing was written into the code snapshot.
The scripts (tests/frameworks/) use only their framework's documented API; 2 CPU ranks over gloo each.
Then an HF run killed with SIGKILL, whose last checkpoint was cut short as a kill during its save
leaves it: the next attempt resumes from the checkpoint before.

    python -m pytest tests/slurm/test_frameworks.py -m slurm
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from hpc import status, submit
from hpc.cluster.preempt import job_field, preempt, release_hold
from hpc.recovery import inplace, nodefail
from hpc.rundir.run import RunDir
from tests.slurm.requeue_helpers import wait_for

# Looked up, not imported: Lightning alone costs each worker about 3.5 s of CPU to import at collection.
MISSING = [name for name in ("lightning", "transformers", "accelerate") if importlib.util.find_spec(name) is None]
pytestmark = [pytest.mark.slurm,
              pytest.mark.skipif(bool(MISSING), reason=f"not installed: {', '.join(MISSING)} (the test extra)")]

SCRIPTS = Path(__file__).resolve().parents[1] / "frameworks"
STEPS = 40
HOLD_AT = 12  # where the scripts wait for the test (tests/frameworks/README.md)
SAVE_ON_SIGNAL = {"lightning", "hf"}  # the presets that save when stopped
KILL_STEPS = 30  # the kill test's run: long enough for two checkpoints before the kill
# (the command after --, hpc's options): one command per framework, as docs/scripts.md shows them
FRAMEWORKS = {
    "lightning": (["train_lightning.py"], []),
    "hf": (["train_hf.py"], []),
    "accelerate": (["train_accelerate.py"], ["--accelerate-config", "accelerate_cpu.yaml",
                                             "--resume-if", "out/checkpoints/checkpoint_*", "--resume-args", "--resume"]),
    "torchrun": (["train_torchrun.py"], ["--resume-if", "out/ckpt.pt", "--resume-args", "--init_from=resume"]),
}


def progress(run_dir: Path) -> dict:
    try:
        return json.loads((run_dir / "main" / "work" / "progress.json").read_text())
    except (FileNotFoundError, ValueError):
        return {}


def restarts_in_place(run_dir: Path) -> list:
    """The task's restarts in place, from its history (hpc.recovery.nodefail, as hpc.status reads it)."""
    path = run_dir / "main" / nodefail.HISTORY
    events = json.loads(path.read_text()).get("events", []) if path.exists() else []
    return [e for e in events if e.get("kind") == inplace.KIND]


def submit_script(run_dir: Path, script: str, options: list, *overrides: str, tasks: int = 2) -> str:
    assert submit.main(["run", "--cluster", "slurm", "--run-dir", str(run_dir), "--tasks-per-node", str(tasks),
                        "stages.main.cpus_per_task=1", "stages.main.partition=low", *overrides, *options,
                        "--", sys.executable, script]) == 0
    return RunDir(run_dir).tasks()[-1]["job_id"]


def snapshot_untouched(run_dir: Path) -> list:
    """Files of the run's snapshot (in its root's store) that its listing does not name: outputs
    written into the code."""
    extra = []
    for listing in [Path(f"{RunDir(run_dir).manifest()['snapshot']['dir']}.json")]:
        listed = set(json.loads(listing.read_text())["files"])
        copy = listing.with_suffix("")
        extra += [str(p) for p in copy.rglob("*") if p.is_file() and str(p.relative_to(copy)) not in listed]
    return extra


@pytest.fixture
def project(tmp_path, monkeypatch):
    proj = tmp_path / "proj"
    shutil.copytree(SCRIPTS, proj)
    monkeypatch.chdir(proj)
    monkeypatch.setenv("MAX_STEPS", str(STEPS))  # sbatch passes the submitting shell's variables on
    monkeypatch.setenv("HOLD_AT", str(HOLD_AT))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    return proj


def preempted_at(cluster, job: str) -> bool:
    return job_field(cluster, job, "PreemptTime") not in {"", "None", "Unknown"} or \
        int(job_field(cluster, job, "Restarts") or 0) > 0


@pytest.mark.parametrize("pair", [("lightning", "torchrun"), ("hf", "accelerate")])
def test_each_frameworks_script_is_preempted_and_resumes_to_the_end(slurm_cluster, project, tmp_path, pair):
    """Two frameworks at a time, both on node n1: both hold at step HOLD_AT (the scripts' test gate),
    one preemption of n1 takes both, and they go on while SLURM's SIGTERM is on its way."""
    runs = {name: tmp_path / f"run-{name}" for name in pair}
    jobs = {name: submit_script(runs[name], FRAMEWORKS[name][0][0], FRAMEWORKS[name][1],
                                "stages.main.extra.nodelist=n1") for name in pair}
    for name in pair:
        wait_for(lambda: progress(runs[name]).get("step", 0) >= HOLD_AT, f"{name} at step {HOLD_AT}", timeout=240)
    preemption = threading.Thread(target=preempt, args=(slurm_cluster, jobs[pair[0]]), kwargs={"release": False})
    preemption.start()
    wait_for(lambda: all(preempted_at(slurm_cluster, j) for j in jobs.values()), "the preemption", timeout=60)
    for run_dir in runs.values():
        (run_dir / "main" / "work" / "go").touch()  # those still alive in their grace time go on
    preemption.join()
    for name, job in jobs.items():
        wait_for(lambda: int(job_field(slurm_cluster, job, "Restarts") or 0) == 1, f"{name} requeued", timeout=120)
        release_hold(slurm_cluster, job, time.monotonic() + 60)
    for name, job in jobs.items():
        wait_for(lambda: job_field(slurm_cluster, job, "JobState") in {"COMPLETED", "FAILED", "CANCELLED"},
                 f"{name} to end", timeout=300)
    for name, job in jobs.items():
        got = progress(runs[name])
        log = runs[name] / "main" / "logs" / job / f"{job}_0_log.err"
        assert job_field(slurm_cluster, job, "JobState") == "COMPLETED", (name, log.read_text()[-3000:])
        assert job_field(slurm_cluster, job, "Restarts") == "1", name
        # the requeued attempt was never restarted in place (as after a rank that died at exit, its work done)
        assert restarts_in_place(runs[name]) == [], name
        # the requeued attempt reached STEPS; where the first got there within its grace time, HF's Trainer
        # resumed from that checkpoint at max_steps trains one step more
        assert got["restart"] == "1" and (got["step"] == STEPS or name == "hf" and
                                          got["started"] == got["step"] - 1 == STEPS), (name, got)
        # resumed, not from step 0: Lightning and HF from what they saved on the signal, the others from
        # their last checkpoint of every 5 steps
        assert got["started"] >= (HOLD_AT if name in SAVE_ON_SIGNAL else 5), (name, got)
        assert snapshot_untouched(runs[name]) == [], name


def test_an_hf_run_killed_mid_save_resumes_from_the_checkpoint_before(slurm_cluster, project, tmp_path, capsys,
                                                                     monkeypatch):
    monkeypatch.setenv("MAX_STEPS", str(KILL_STEPS))
    monkeypatch.delenv("HOLD_AT")  # no gate: it is killed as it runs
    run_dir = tmp_path / "run-hf-kill"
    # one rank: what a kill leaves and the resume that follows are rank 0's checkpoints; the 2-rank
    # HF run is preempted and resumed above, and each rank imports transformers at about 9 s of CPU
    job = submit_script(run_dir, "train_hf.py", [], tasks=1)
    out = run_dir / "main" / "work" / "out"
    wait_for(lambda: (out / "checkpoint-10" / "trainer_state.json").exists(), "two checkpoints", timeout=240)
    subprocess.run(["scancel", "--signal=KILL", "--full", job], check=True)  # kill -9, every process of the job
    wait_for(lambda: job_field(slurm_cluster, job, "JobState") not in {"RUNNING", "COMPLETING"}, "the kill",
             timeout=120)
    done = sorted((p for p in out.glob("checkpoint-*") if (p / "trainer_state.json").exists()),
                  key=lambda p: int(p.name.split("-")[1]))
    last = done[-1]
    # what a SIGKILL during the next save leaves: the weights half written, no trainer_state.json yet
    cut = out / f"checkpoint-{int(last.name.split('-')[1]) + 5}"
    cut.mkdir(exist_ok=True)  # the kill itself may have left it half written
    weights = (last / "model.safetensors").read_bytes()
    (cut / "model.safetensors").write_bytes(weights[: len(weights) // 2])
    again = submit_script(run_dir, "train_hf.py", [], tasks=1)
    wait_for(lambda: job_field(slurm_cluster, again, "JobState") in {"COMPLETED", "FAILED"}, "the next attempt",
             timeout=300)
    err = (run_dir / "main" / "logs" / again / f"{again}_0_log.err").read_text()
    assert job_field(slurm_cluster, again, "JobState") == "COMPLETED", err[-3000:]
    assert f"resuming from out/{last.name}" in err
    assert progress(run_dir)["started"] == int(last.name.split("-")[1]) and progress(run_dir)["step"] == KILL_STEPS
    assert not cut.exists() and list((run_dir / "main" / "incomplete").glob(f"{cut.name}.*"))
    capsys.readouterr()
    status.main([str(run_dir)])
    assert "incomplete checkpoint(s) set aside" in capsys.readouterr().out
