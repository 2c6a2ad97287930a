"""Pyxis: a registry image imported once, at submission, to a shared .sqsh (hpc.container.squash).
enroot cannot run here: a fake one on PATH records its arguments and writes the file."""
import os
import threading
from types import SimpleNamespace

import pytest

from hpc.config.checks import ConfigError
from hpc.container import spec

IMAGE = "nvcr.io#nvidia/pytorch:24.05-py3"
FAKE = """#!/bin/sh
echo "$@" >> {log}
sleep 0.5
if [ -n "$FAKE_ENROOT_FAIL" ]; then
    echo "[ERROR] URL https://nvcr.io/v2/ returned error code: 401 Unauthorized" >&2; exit 1
fi
[ "$1 $2" = "import -o" ] && echo sqsh > "$3"
"""


@pytest.fixture
def enroot(tmp_path, monkeypatch):
    """A fake enroot on PATH; returns the file its calls go to, one line each."""
    bin_dir, log = tmp_path / "bin", tmp_path / "enroot.log"
    bin_dir.mkdir()
    (bin_dir / "enroot").write_text(FAKE.format(log=log))
    (bin_dir / "enroot").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    (tmp_path / "images").mkdir()
    return log


def jobs(path, stages=("rgb", "features"), image=IMAGE):
    """The resolved container of each stage's job, as the plan holds it (hpc's copy left to the image here)."""
    section = {"runtime": "pyxis", "image": image, "squash": str(path), "hpc": "image"}
    return [SimpleNamespace(resources={"container": spec.resolve(section, "cluster.container", "/RUN", {}, s)})
            for s in stages]


def calls(log):
    return log.read_text().splitlines() if log.exists() else []


def test_the_image_is_imported_once_and_the_jobs_run_the_file(tmp_path, enroot):
    path = tmp_path / "images" / "torch.sqsh"
    planned = jobs(path)
    for job in planned:  # the srun line names the file, not the registry
        args = spec.launch(job.resources["container"], 0).srun_args
        assert f"--container-image={path}" in args and not any(IMAGE in a for a in args)
    assert not path.exists()  # resolving (the plan, a dry run) imports nothing
    (note,) = [n for n in spec.notes(planned) if n.startswith("image:")]
    assert IMAGE in note and str(path) in note

    results = []
    threads = [threading.Thread(target=lambda: results.extend(spec.prepare(jobs(path)))) for _ in range(2)]
    for t in threads:  # two submissions at once
        t.start()
    for t in threads:
        t.join()
    (call,) = calls(enroot)  # one import for both submissions and both stages
    words = call.split()
    assert words[:2] == ["import", "-o"] and words[3] == f"docker://{IMAGE}"
    assert words[2].startswith(f"{path}.tmp-")  # written beside it, renamed when whole
    assert path.read_text() == "sqsh\n" and sorted(os.listdir(path.parent)) == ["torch.sqsh", "torch.sqsh.lock"]
    assert any("imported to" in r for r in results) and any("another submission" in r for r in results), results

    assert spec.prepare(jobs(path)) == [f"image: {path} is there, not imported again"]
    assert len(calls(enroot)) == 1


def test_a_failed_import_leaves_nothing_and_says_why(tmp_path, enroot, monkeypatch):
    monkeypatch.setenv("FAKE_ENROOT_FAIL", "1")
    path = tmp_path / "images" / "torch.sqsh"
    with pytest.raises(RuntimeError, match="401 Unauthorized.*HINT: check the name and your registry credentials"):
        spec.prepare(jobs(path, stages=("rgb",)))
    assert not path.exists() and not [p for p in os.listdir(path.parent) if ".tmp-" in p]


@pytest.mark.parametrize("section, seen", [
    ({"runtime": "apptainer", "image": "docker://x/y", "squash": "SITE/images/a.sqsh"}, "pyxis only"),
    ({"runtime": "pyxis", "image": "SITE/images/t.sqsh", "squash": "SITE/images/a.sqsh"}, "a file"),
    ({"runtime": "pyxis", "image": IMAGE, "squash": "SITE/nowhere/a.sqsh"}, "existing folder"),
    ({"runtime": "pyxis", "image": IMAGE, "squash": "images/a.sqsh"}, "absolute path"),
])
def test_a_squash_file_that_cannot_be_made_is_refused_before_submission(tmp_path, enroot, section, seen):
    (tmp_path / "images" / "t.sqsh").write_text("")
    section = {k: v.replace("SITE", str(tmp_path)) for k, v in section.items()}
    with pytest.raises(ConfigError, match="HINT") as err:
        spec.resolve(section, "cluster.container", "/RUN", {}, "rgb")
    assert seen in str(err.value) and "\n" not in str(err.value)
    assert calls(enroot) == []
