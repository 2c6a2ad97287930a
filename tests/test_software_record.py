"""The software each attempt ran on (hpc.rundir.software, hpc.rundir.attempts): recorded by rank 0 of
hpc's training loop, a changed package shown between two attempts, and refused on resume under
resume.same_software=require with a one-line HINT.

    python -m pytest tests/test_software_record.py -q
"""
import json
import os
import subprocess
import sys
from pathlib import Path

from hpc.rundir import attempts, software

ROOT = Path(__file__).resolve().parents[1]
# one task of a run: a loop of 3 steps (6 on the second attempt) saving every step
TRAIN = """
import sys, torch
from hpc import ddp
from hpc.trainloop import TrainLoop
with ddp.session() as s:
    model = torch.nn.Linear(2, 1)
    with TrainLoop(s, sys.argv[1], save_every=1, tensorboard=False, watchdog_s=0) as loop:
        loop.resume({"model": model})
        for step in loop.steps(int(sys.argv[2])):
            model(torch.ones(1, 2)).sum().backward()
"""


def fake_site(root: Path, version: str) -> Path:
    """A site-packages folder holding one distribution, hpcfake==version."""
    site = root / "site-packages"
    for old in site.glob("hpcfake-*.dist-info"):
        for f in old.iterdir():
            f.unlink()
        old.rmdir()
    info = site / f"hpcfake-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: hpcfake\nVersion: {version}\n")
    return site


def attempt(task: Path, site: Path, job: str, steps: int, cache: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(site)]), "SLURM_JOB_ID": job,
           "HPC_CACHE_DIR": str(cache)}
    for var in ("SLURM_PROCID", "SLURM_NTASKS", "RANK", "WORLD_SIZE", "SLURM_ARRAY_JOB_ID", "HPC_SAME_SOFTWARE"):
        env.pop(var, None)
    return subprocess.run([sys.executable, "-c", TRAIN, str(task), str(steps)], env=env, capture_output=True,
                          text=True, timeout=300)


def run_dir(tmp_path: Path, policy: str) -> Path:
    run = tmp_path / policy
    (run / "train").mkdir(parents=True)
    (run / "config.yaml").write_text(f"resume:\n  same_software: {policy}\n")
    (run / "manifest.json").write_text("{}")
    return run / "train"


def test_the_record_names_torch_python_hpc_and_a_package_digest():
    first = software.record()
    assert first["torch"] and first["python"] and first["hpc"] and len(first["packages"]) == 16
    assert software.installed()["torch"].split("+")[0] == first["torch"].split("+")[0]  # a wheel may name its build: 2.13.0+cpu
    assert software.record() == first
    changed = dict(first, torch="0.0.1")
    assert software.differences(first, changed) == [f"torch {first['torch']} -> 0.0.1"]
    assert software.digest(first) != software.digest(changed)


def test_a_changed_package_is_shown_and_require_refuses_the_resume(tmp_path):
    cache = tmp_path / "cache"
    for policy in ("warn", "require"):
        task = run_dir(tmp_path, policy)
        first = attempt(task, fake_site(tmp_path / policy, "1.0"), "101", 3, cache)
        assert first.returncode == 0, first.stderr
        second = attempt(task, fake_site(tmp_path / policy, "2.0"), "102", 6, cache)
        entries = attempts.load(task)
        assert [e["job"] for e in entries] == ["101", "102"]
        assert entries[0]["software"]["packages"] != entries[1]["software"]["packages"]
        line = attempts.software_change(entries)
        assert "attempt 2 (job 102) ran on different software: packages" in line and "not a bitwise" in line
        if policy == "warn":
            assert second.returncode == 0, second.stderr
            assert entries[1]["resumed"] == 3 and entries[1]["end"] == "completed"
            continue
        assert second.returncode != 0 and entries[1]["end"] == "refused"
        said = second.stderr.strip().splitlines()[-1]
        assert said.startswith("hpc.rundir.attempts.SoftwareChanged: resume of") and "HINT:" in said, said
        assert "expected the software of job 101" in said and "resume.same_software=warn" in said


def test_an_attempt_records_its_first_step_checkpoints_and_end(tmp_path):
    task = run_dir(tmp_path, "warn")
    assert attempt(task, fake_site(tmp_path, "1.0"), "7", 3, tmp_path / "cache").returncode == 0
    (entry,) = attempts.load(task)
    assert entry["began"] <= entry["first_step"] <= entry["ended"] and entry["end"] == "completed"
    assert [s[0] for s in entry["saves"]] == [1, 2, 3] and entry["step"] == 3
    assert entry["stall_s"] >= entry["saves"][-1][2] >= 0
    assert json.loads((task / attempts.ATTEMPTS).read_text())["attempts"][0]["software_digest"]


def test_an_unknown_same_software_policy_is_refused_at_submission(tmp_path):
    import pytest

    import hpc

    with pytest.raises(hpc.ConfigError, match=r"resume.same_software='always'; expected one of \['warn', 'require'\]"
                                              r"\. HINT"):
        hpc.submit("tests.tiny_pipeline", cluster="local", run_dir=tmp_path / "run", dry_run=True,
                   overrides=["resume.same_software=always"])


def image(path: Path, size: int, fill: bytes, head: bytes = b"hsqs") -> Path:
    """A squashfs-like image file of `size` bytes: its magic, then `fill` repeated, its time fixed."""
    data = (head + fill * (size // len(fill) + 1))[:size]
    path.write_bytes(data)
    os.utime(path, ns=(10**18, 10**18))
    return path


def test_the_container_image_is_stamped_by_its_content_not_its_size_and_time(tmp_path):
    from hpc.rundir import imagestamp

    size = 3 * imagestamp.SAMPLES * imagestamp.BLOCK  # sampled, not hashed whole
    first = software.record(environ={"APPTAINER_CONTAINER": str(image(tmp_path / "a.sqsh", size, b"v1"))})
    # rebuilt in place: the same size and modification time, other bytes (a squashfs's tables move)
    rebuilt = software.record(environ={"APPTAINER_CONTAINER": str(image(tmp_path / "a.sqsh", size, b"v2"))})
    assert first["image"].startswith(f"apptainer:{tmp_path / 'a.sqsh'}@squashfs:sample-sha256:"), first["image"]
    assert software.differences(first, rebuilt) == [f"image {first['image']} -> {rebuilt['image']}"]
    # the same image copied elsewhere, with another time: the same software
    copy = tmp_path / "elsewhere.sqsh"
    copy.write_bytes((tmp_path / "a.sqsh").read_bytes())
    moved = software.record(environ={"APPTAINER_CONTAINER": str(copy)})
    assert software.differences(rebuilt, moved) == [] and software.digest(rebuilt) == software.digest(moved)
    sif = image(tmp_path / "b.sif", 1000, b"x", head=b"#!/usr/bin/env run-singularity\n\0SIF_MAGIC")
    assert imagestamp.stamp(str(sif)).startswith("sif:sha256:")  # small: hashed whole
    digest = "ab" * 32
    (tmp_path / "oci").mkdir()
    (tmp_path / "oci" / "index.json").write_text(json.dumps({"manifests": [{"digest": f"sha256:{digest}"}]}))
    assert imagestamp.stamp(str(tmp_path / "oci")) == f"oci:sha256:{digest}"
    assert imagestamp.stamp(f"nvcr.io#nvidia/pytorch@sha256:{digest}") == f"ref:sha256:{digest}"
    assert software.record(environ={"HPC_CONTAINER_IMAGE": "nvcr.io#nvidia/pytorch:24.01"})["image"] == \
        "image:nvcr.io#nvidia/pytorch:24.01"  # a reference not pinned to a digest: its name alone
