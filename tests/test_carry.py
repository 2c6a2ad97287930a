"""hpc carried into a container (hpc.container.carry): one copy per set of files, reused, never half-made,
and enough on its own to import what a rank imports of hpc, with no site-packages at all."""
import json
import os
import shutil
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

import pytest

from hpc.container import carry
from hpc.rundir import treecopy
from tests.midcopy import kill_mid_copy


@pytest.fixture
def packages(tmp_path, monkeypatch):
    """Two small modules to carry: a package with a compiled file and bytecode beside its source, and a
    single-file module."""
    src = tmp_path / "src"
    (src / "pkga" / "__pycache__").mkdir(parents=True)
    (src / "pkga" / "__init__.py").write_text("VALUE = 1\n")
    (src / "pkga" / "sub.py").write_text("X = 2\n")
    (src / "pkga" / "_fast.cpython-311-x86_64-linux-gnu.so").write_bytes(b"\x7fELF")
    (src / "pkga" / "__pycache__" / "sub.cpython-311.pyc").write_bytes(b"pyc")
    (src / "modb.py").write_text("Y = 3\n")
    monkeypatch.syspath_prepend(str(src))
    monkeypatch.setattr(carry, "CARRIED", ("pkga", "modb", "not_installed_here"))
    monkeypatch.setenv("HPC_CACHE_DIR", str(tmp_path / "cache"))
    carry.listing.cache_clear()
    yield src
    carry.listing.cache_clear()


def tree(path):
    return sorted(str(p.relative_to(path)) for p in Path(path).rglob("*") if p.is_file())


def test_a_copy_is_named_by_its_files_and_reused(packages, tmp_path, monkeypatch):
    first = carry.folder()
    assert Path(first).parent == tmp_path / "cache" / carry.FOLDER and not os.path.exists(first)  # nothing made yet
    made = carry.ensure()
    assert made.dir == first and not made.reused and made.files == 3
    # sources only: nothing compiled for the host, no bytecode; a module not installed is the image's
    assert tree(first) == [carry.LISTING, "modb.py", "pkga/__init__.py", "pkga/sub.py"]
    assert (Path(first) / "pkga" / "sub.py").read_text() == "X = 2\n"

    copies = []
    real_copy = treecopy.copy_one
    monkeypatch.setattr(treecopy, "copy_one", lambda src, mode, dst: copies.append(dst) or real_copy(src, mode, dst))
    again = carry.ensure()
    assert again.reused and again.dir == first and "reused" in again.summary()
    assert copies == []  # a later submission copies nothing

    (packages / "pkga" / "sub.py").write_text("X = 20\n")  # a changed file: another copy, the old one kept
    carry.listing.cache_clear()
    second = carry.ensure()
    assert second.dir != first and not second.reused and len(copies) == 3
    assert (Path(second.dir) / "pkga" / "sub.py").read_text() == "X = 20\n"
    assert (Path(first) / "pkga" / "sub.py").read_text() == "X = 2\n"  # a queued job may still run it


KILLED = """
import sys, time
sys.path.insert(0, {src!r})
from hpc.container import carry
from hpc.rundir import treecopy
from hpc.rundir import treecopy
carry.CARRIED = ("pkga", "modb")
real = treecopy.copy_one
def slow(*args):
    real(*args)
    time.sleep(30)  # the submission is killed here, one file copied
treecopy.copy_one = slow
carry.ensure()
"""


def test_a_copy_from_a_killed_submission_is_never_used(packages, tmp_path, monkeypatch):
    monkeypatch.setattr(carry, "CARRIED", ("pkga", "modb"))
    carry.listing.cache_clear()
    parent = tmp_path / "cache" / carry.FOLDER
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(carry.__file__).parents[2]), str(packages)])}
    proc = subprocess.Popen([sys.executable, "-c", KILLED.format(src=str(packages))], env=env)
    kill_mid_copy(proc, parent)
    (half,) = parent.glob(".tmp-*")
    assert not os.path.exists(carry.folder())  # the half-made copy is not under the name the jobs use
    # another submission still copying: this host's with its process alive, another host's while young
    busy = [parent / f".tmp-{treecopy._host()}-{os.getpid()}-0000abcd", parent / ".tmp-elsewhere-1-0000abcd"]
    for path in busy:
        path.mkdir()
    made = carry.ensure()
    assert not made.reused and tree(made.dir) == [carry.LISTING, "modb.py", "pkga/__init__.py", "pkga/sub.py"]
    assert not half.exists()  # its process is gone: the next copy removed it
    assert all(p.exists() for p in busy)
    old = time.time() - treecopy.STALE_S - 60
    os.utime(busy[1], (old, old))
    (packages / "modb.py").write_text("Y = 30\n")
    carry.listing.cache_clear()
    carry.ensure()
    assert not busy[1].exists() and busy[0].exists()  # another host's, once stale


def test_a_folder_without_its_listing_is_refused_not_used(packages, tmp_path):
    where = Path(carry.folder())
    (where / "pkga").mkdir(parents=True)
    (where / "pkga" / "__init__.py").write_text("")  # a copy someone removed halfway by hand
    with pytest.raises(RuntimeError, match="HINT: remove"):
        carry.ensure()


def test_the_copy_alone_imports_hpc_and_submitits_runner(tmp_path, monkeypatch):
    """No site-packages (-S), no PYTHONPATH (-E): only the copy and the standard library. The modules
    a rank loads before torch (submitit's runner, the stage task, the host's answer) and those it
    may load (OmegaConf, yaml without its C part, tqdm, LangSplat's and the `run` pipeline's modules)
    all come from the copy."""
    monkeypatch.setenv("HPC_CACHE_DIR", str(tmp_path / "cache"))
    carry.listing.cache_clear()
    made = carry.ensure()
    image = tmp_path / "image"  # what submitit needs of a torch image: typing_extensions, a requirement of torch
    image.mkdir()
    import typing_extensions

    shutil.copyfile(typing_extensions.__file__, image / "typing_extensions.py")
    code = ("import sys; sys.path[:0] = sys.argv[1:]; import submitit.core._submit, submitit.slurm.slurm, "
            "cloudpickle, hpc.pipeline.executor, hpc.recovery.hostact, hpc.config.resolved, hpc.jobs.langsplat, "
            "hpc.jobs.run, hpc.templates, omegaconf, yaml, tqdm, json; "
            "import omegaconf.grammar_parser; "  # OmegaConf's parser: antlr4's runtime (2.3) or its own copy (2.4)
            "print(json.dumps({n: getattr(m, '__file__', None) for n, m in sys.modules.items() "
            "if n.split('.')[0] in ('hpc', 'submitit', 'cloudpickle', 'omegaconf', 'antlr4', 'yaml', 'tqdm')}))")
    out = subprocess.run([sys.executable, "-S", "-E", "-c", code, made.dir, str(image)], capture_output=True, text=True,
                         cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    files = json.loads(out.stdout)
    assert {"omegaconf", "omegaconf.grammar_parser", "yaml", "hpc.jobs.langsplat", "hpc.templates"} <= set(files)
    assert all(f is None or f.startswith(made.dir + os.sep) for f in files.values()), files


def _requires(name):
    """The distributions `name` requires here (no extras, markers of this machine)."""
    from packaging.requirements import Requirement

    reqs = [Requirement(r) for r in metadata.requires(name) or []]
    return [r.name for r in reqs if not r.marker or r.marker.evaluate({"extra": ""})]


def _tops(dist_names):
    """The import names of these distributions and of everything they require, transitively."""
    seen, todo, tops = set(), list(dist_names), set()
    while todo:
        name = todo.pop().lower().replace("_", "-")
        if name in seen:
            continue
        seen.add(name)
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        tops |= set((dist.read_text("top_level.txt") or "").split()) or {name.replace("-", "_")}
        todo += _requires(name)
    return tops


def test_every_requirement_of_hpc_is_carried_or_the_images():
    """hpc's requirements, transitively: each is carried, or comes with what the image must have
    (torch and its own requirements, numpy, tensorboard: docs/containers.md)."""
    image = _tops(carry.IMAGE)
    missing = _tops(_requires("hpc")) - image - {m.split(".")[0] for m in carry.CARRIED} - {"_yaml"}  # yaml's C part
    assert not missing, f"neither carried nor the image's: {sorted(missing)}"
