"""A task's working directory (hpc.rundir.workdir): snapshot code and left-out data read through
links, writes kept, nothing importable from the live tree, and relinking on a new snapshot."""

import os
import subprocess
import sys
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from hpc.rundir.workdir import lay_out


def tree(root: Path, files: dict) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def setup(tmp_path):
    live = tree(tmp_path / "live", {"train.py": "live code", "model/__init__.py": "", "model/net.py": "live net",
                                    "data/shake/prepare.py": "prep", "data/shake/train.bin": "BIN",
                                    "big.npy": "NPY", "secret_helper.py": "ignored code",
                                    "vendored/__init__.py": "", "out/ckpt.pt": "stale",
                                    ".git/HEAD": "ref", "runs/r1/x": "run dir content"})
    code = tree(tmp_path / "code", {"train.py": "snap code", "model/__init__.py": "", "model/net.py": "snap net",
                                    "data/shake/prepare.py": "prep"})
    return live, code


def test_code_reads_the_snapshot_data_reads_the_live_tree_and_writes_stay(tmp_path):
    live, code = setup(tmp_path)
    work = tmp_path / "run" / "main" / "work"
    done = lay_out(work, code, live, never=[live / "runs" / "r1"])
    assert (work / "train.py").read_text() == "snap code"
    assert (work / "model" / "net.py").read_text() == "snap net"
    assert (work / "data" / "shake" / "train.bin").read_text() == "BIN"  # git-ignored data, in place
    assert (work / "big.npy").read_text() == "NPY"
    assert not (work / "secret_helper.py").exists() and not (work / "vendored").exists()  # live code: never
    assert not (work / "out").exists() and not (work / ".git").exists()  # stale outputs, VCS
    assert not (work / "runs" / "r1").exists()  # the run directory itself
    assert done.code_links == 4 and done.data_links == 2
    (work / "out").mkdir()
    (work / "out" / "ckpt.pt").write_text("mine")  # the script's output: a real file
    (work / "data" / "shake" / "log.txt").write_text("written")
    assert not (live / "data" / "shake" / "log.txt").exists()
    # a new snapshot (a resubmission after an edit): relinked, the outputs stay
    code2 = tree(tmp_path / "code2", {"train.py": "edited", "model/__init__.py": "", "data/shake/prepare.py": "p"})
    lay_out(work, code2, live, never=[live / "runs" / "r1"])
    assert (work / "train.py").read_text() == "edited"
    assert not (work / "model" / "net.py").exists()  # gone from the new snapshot
    assert (work / "out" / "ckpt.pt").read_text() == "mine"
    assert (work / "data" / "shake" / "log.txt").read_text() == "written"


def test_nothing_of_the_live_tree_is_importable_from_the_working_dir(tmp_path):
    live, code = setup(tmp_path)
    (live / "secret_helper.py").write_text("X = 'live'")
    work = tmp_path / "work"
    lay_out(work, code, live)
    probe = "import importlib.util as u; print(u.find_spec('secret_helper') is None, u.find_spec('vendored') is None)"
    out = subprocess.run([sys.executable, "-c", probe], cwd=work, capture_output=True, text=True,
                         env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert out.stdout.split() == ["True", "True"], out.stderr


def test_without_a_snapshot_the_live_tree_is_the_code(tmp_path):
    live, _ = setup(tmp_path)
    work = tmp_path / "work"
    lay_out(work, None, live)
    assert (work / "train.py").read_text() == "live code" and (work / "secret_helper.py").exists()
    assert not (work / "out").exists()


@settings(max_examples=30, deadline=None)
@given(st.lists(st.sampled_from(["a.py", "d/b.txt", "d/e/c.bin", "f.bin", "d/g.py"]), unique=True),
       st.lists(st.sampled_from(["a.py", "d/b.txt", "d/e/c.bin", "f.bin", "d/g.py", "d/new.txt"]), unique=True))
def test_any_snapshot_then_any_other_leaves_only_links_to_the_second(tmp_path_factory, first, second):
    root = tmp_path_factory.mktemp("w")
    live = tree(root / "live", {"a.py": "a", "d/b.txt": "b", "d/e/c.bin": "c", "f.bin": "f", "d/g.py": "g"})
    work = root / "work"
    for files in (first, second):
        code = tree(root / f"code{len(files)}-{files is second}", {rel: f"snap {rel}" for rel in files})
        lay_out(work, code, live)
    for dirpath, _dirs, names in os.walk(work):
        for name in names:
            path = Path(dirpath) / name
            target = os.readlink(path)
            rel = str(path.relative_to(work))
            assert (rel in second and target.endswith(rel) and "code" in target) or \
                   (rel not in second and target.startswith(str(live)) and not rel.endswith(".py"))
