"""The code snapshot (hpc.rundir.snapshot): what is copied, reuse, limits, and how the live tree is compared."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hpc.rundir import codefiles, snapcache, snapshot


def git(root, *args):
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=root, check=True,
                          capture_output=True, text=True).stdout.strip()


@pytest.fixture
def checkout(tmp_path):
    """A git checkout with committed, modified, untracked, ignored and deleted files."""
    root = tmp_path / "repo"
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "__init__.py").write_text("")
    (root / "pkg" / "mod.py").write_text("VERSION = 'committed'\n")
    (root / "gone.py").write_text("x = 1\n")
    (root / "run.sh").write_text("#!/bin/sh\n")
    (root / "run.sh").chmod(0o755)
    (root / ".gitignore").write_text("ignored/\n")
    git(root, "init", "-q")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "code")
    (root / "pkg" / "mod.py").write_text("VERSION = 'uncommitted'\n")  # a change not committed
    (root / "gone.py").unlink()  # an uncommitted deletion
    (root / "new.py").write_text("y = 2\n")  # untracked, not ignored: code not added yet
    (root / "data.bin").write_bytes(b"\0" * (codefiles.UNTRACKED_MAX_BYTES + 1))  # untracked data
    (root / "ignored").mkdir()
    (root / "ignored" / "cache.txt").write_text("no")
    os.symlink("pkg/mod.py", root / "link.py")
    return root


def current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def files_in(directory: Path):
    return sorted(str(p.relative_to(directory)) for p in directory.rglob("*") if not p.is_dir())


def test_a_snapshot_holds_tracked_files_with_their_changes_and_small_untracked_ones(checkout, tmp_path):
    run = checkout / "runs" / "r1"  # the run dir inside the checkout is never copied into itself
    (run / "old").mkdir(parents=True)
    (run / "old" / "x.py").write_text("")
    snap = snapshot.take(codefiles.source_of(str(checkout), checkout, [run]), run, max_mb=10)
    listed = [".gitignore", "link.py", "new.py", "pkg/__init__.py", "pkg/mod.py", "run.sh"]
    assert files_in(snap.dir) == listed
    assert (snap.dir / "pkg" / "mod.py").read_text() == "VERSION = 'uncommitted'\n"
    assert os.readlink(snap.dir / "link.py") == "pkg/mod.py"
    mode = lambda rel: (snap.dir / rel).stat().st_mode & 0o777  # noqa: E731 (root ignores it: test the bits)
    assert mode("run.sh") == 0o555 & ~current_umask() and mode("pkg/mod.py") == 0o444 & ~current_umask()
    assert snap.skipped == ("data.bin",) and "data.bin" in snap.summary()
    store = checkout / "runs" / snapcache.STORE  # the run root's store, in the checkout: never copied either
    assert snap.dir == store / snap.hash and (store / f"{snap.hash}.json").exists() and not (run / "code").exists()
    assert snap.record()["files"] == 6 and not snap.reused
    (checkout / "pkg" / "mod.py").write_text("VERSION = 'edited'\n")
    other = checkout / "elsewhere" / "r2"  # another run root in the checkout, whose store is not code either
    again = snapshot.take(codefiles.source_of(str(checkout), checkout, [run, other]), other, max_mb=10)
    assert files_in(again.dir) == listed and again.dir.parent == checkout / "elsewhere" / snapcache.STORE


def test_unchanged_code_reuses_the_snapshot_and_a_change_makes_a_new_one(checkout, tmp_path, monkeypatch):
    source = codefiles.source_of(str(checkout), checkout)
    first = snapshot.take(source, tmp_path / "run", max_mb=10)
    again = snapshot.take(source, tmp_path / "run", max_mb=10, previous=first.hash)
    assert again.reused and again.hash == first.hash
    same_root = snapshot.take(source, tmp_path / "other", max_mb=10)  # another run of the root: the same copy
    assert same_root.reused and same_root.dir == first.dir and not (tmp_path / "other").exists()
    monkeypatch.setenv("HPC_CACHE_DIR", str(tmp_path / "empty-cache"))  # nothing to link: copied
    other = snapshot.take(source, tmp_path / "root2" / "other", max_mb=10)  # a fresh copy has the same name
    assert other.hash == first.hash and not other.reused and not other.linked
    (checkout / "pkg" / "mod.py").write_text("VERSION = 'edited'\n")
    changed = snapshot.take(source, tmp_path / "run", max_mb=10, previous=first.hash)
    assert not changed.reused and changed.hash != first.hash
    assert (first.dir / "pkg" / "mod.py").read_text() == "VERSION = 'uncommitted'\n"  # the old one stays


def test_a_new_run_dir_links_an_earlier_snapshot_of_the_same_files_and_copies_after_a_change(
        checkout, tmp_path, monkeypatch):
    monkeypatch.setenv("HPC_CACHE_DIR", str(tmp_path / "cache"))
    source = codefiles.source_of(str(checkout), checkout)
    first = snapshot.take(source, tmp_path / "r1" / "a", max_mb=10)
    second = snapshot.take(source, tmp_path / "r2" / "b", max_mb=10)  # another root: linked into its store
    assert not first.linked and second.linked and not second.reused and "linked" in second.summary()
    assert second.hash == first.hash and files_in(second.dir) == files_in(first.dir)
    assert os.path.samefile(second.dir / "pkg" / "mod.py", first.dir / "pkg" / "mod.py")
    assert os.readlink(second.dir / "link.py") == "pkg/mod.py"
    listed = lambda snap: json.loads(Path(f"{snap.dir}.json").read_text())  # noqa: E731
    assert listed(second)["files"] == listed(first)["files"]
    (checkout / "pkg" / "mod.py").write_text("VERSION = 'edited'\n")
    third = snapshot.take(source, tmp_path / "r3" / "c", max_mb=10)
    assert not third.linked and third.hash != first.hash
    assert (third.dir / "pkg" / "mod.py").read_text() == "VERSION = 'edited'\n"
    assert (first.dir / "pkg" / "mod.py").read_text() == "VERSION = 'uncommitted'\n"
    import shutil

    shutil.rmtree(third.dir)  # the newest snapshot is gone: the next run dir copies again
    (checkout / "pkg" / "mod.py").write_text("VERSION = 'again'\n")
    fourth = snapshot.take(source, tmp_path / "r4" / "d", max_mb=10)
    assert not fourth.linked and (fourth.dir / "pkg" / "mod.py").read_text() == "VERSION = 'again'\n"


def edit_keeping_size_and_mtime(path: Path, text: str) -> None:
    """A same-length edit whose mtime is put back: as an edit within one timestamp tick looks."""
    before = path.stat()
    assert len(text) == before.st_size
    path.write_text(text)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))


def test_a_same_length_edit_with_its_mtime_put_back_is_a_change(checkout, tmp_path, monkeypatch):
    monkeypatch.setenv("HPC_CACHE_DIR", str(tmp_path / "cache"))
    source = codefiles.source_of(str(checkout), checkout)
    first = snapshot.take(source, tmp_path / "r1" / "a", max_mb=10)
    edit_keeping_size_and_mtime(checkout / "pkg" / "mod.py", "VERSION = 'uncommittee'\n")
    other = snapshot.take(source, tmp_path / "r2" / "b", max_mb=10)  # another root: not linked to the old copy
    assert not other.linked and (other.dir / "pkg" / "mod.py").read_text() == "VERSION = 'uncommittee'\n"
    again = snapshot.take(source, tmp_path / "r1" / "a", max_mb=10, previous=first.hash)
    assert not again.reused and again.hash == other.hash != first.hash and "reused" not in again.summary()
    assert (again.dir / "pkg" / "mod.py").read_text() == "VERSION = 'uncommittee'\n"
    assert "the live code differs (1 changed (pkg/mod.py))" in snapshot.status_line(first.record())


def test_a_file_edited_within_a_tick_of_its_listing_is_read_again(checkout, tmp_path, monkeypatch):
    """Where timestamps have a 1 s tick, an edit right after the snapshot keeps the ctime as well as
    the size and mtime: the listing's entry is then made to hold the live ctime and inode, and
    only the racy rule (mtime within RACY_NS of the listing) can tell."""
    monkeypatch.setenv("HPC_CACHE_DIR", str(tmp_path / "cache"))
    source = codefiles.source_of(str(checkout), checkout)
    first = snapshot.take(source, tmp_path / "a", max_mb=10)
    path = checkout / "pkg" / "mod.py"
    edit_keeping_size_and_mtime(path, "VERSION = 'uncommittee'\n")
    listing = Path(f"{first.dir}.json")
    table = json.loads(listing.read_text())
    live = os.lstat(path)
    entry = table["files"]["pkg/mod.py"]
    entry[4:6] = [live.st_ctime_ns, live.st_ino]
    listing.write_text(json.dumps(table))
    assert "1 changed (pkg/mod.py)" in snapshot.status_line(first.record())
    again = snapshot.take(source, tmp_path / "a", max_mb=10, previous=first.hash)
    assert not again.reused and (again.dir / "pkg" / "mod.py").read_text() == "VERSION = 'uncommittee'\n"
    unedited = snapshot.take(source, tmp_path / "a", max_mb=10, previous=again.hash)
    assert unedited.reused  # racy files read again and found the same: still reused
    assert not codefiles.clean(entry, live, table["listed_ns"])  # what told: the entry is racy
    assert codefiles.clean(entry, live, table["listed_ns"] + 2 * codefiles.RACY_NS)  # an older one is trusted


def test_an_earlier_copy_that_no_longer_matches_its_listing_is_not_linked(checkout, tmp_path, monkeypatch):
    """Snapshot files are read-only copies, but one changed anyway (by hand, by a tool) must not
    reach a new run: its size differs from the listing, so the new run dir copies the live tree."""
    monkeypatch.setenv("HPC_CACHE_DIR", str(tmp_path / "cache"))
    source = codefiles.source_of(str(checkout), checkout)
    first = snapshot.take(source, tmp_path / "r1" / "a", max_mb=10)
    tampered = first.dir / "pkg" / "mod.py"
    tampered.chmod(0o644)
    tampered.write_text("VERSION = 'tampered with after the snapshot'\n")
    second = snapshot.take(source, tmp_path / "r2" / "b", max_mb=10)  # another root's store
    assert not second.linked and second.hash == first.hash
    assert (second.dir / "pkg" / "mod.py").read_text() == "VERSION = 'uncommitted'\n"
    assert not os.path.samefile(second.dir / "pkg" / "mod.py", tampered)
    assert [p.name for p in second.dir.parent.iterdir() if p.name.startswith(".tmp")] == []


@pytest.mark.parametrize("entry", [b"", b"{\"root\": ", b"[]", b"{\"dir\": 7}", b"\xff\xfe"])
def test_a_torn_or_foreign_cache_entry_costs_one_copy(checkout, tmp_path, monkeypatch, entry):
    """The cache entry is written without fsync: after a crash it may be empty, cut short or
    anything else. The next run dir then copies, and names its own snapshot for the one after."""
    monkeypatch.setenv("HPC_CACHE_DIR", str(tmp_path / "cache"))
    source = codefiles.source_of(str(checkout), checkout)
    first = snapshot.take(source, tmp_path / "r1" / "a", max_mb=10)
    snapcache._entry(source.root).write_bytes(entry)
    second = snapshot.take(source, tmp_path / "r2" / "b", max_mb=10)
    assert not second.linked and second.hash == first.hash
    third = snapshot.take(source, tmp_path / "r3" / "c", max_mb=10)
    assert third.linked and os.path.samefile(third.dir / "pkg" / "mod.py", second.dir / "pkg" / "mod.py")


def test_status_tells_whether_the_live_code_differs_from_the_snapshot(checkout, tmp_path):
    snap = snapshot.take(codefiles.source_of(str(checkout), checkout), tmp_path / "run", max_mb=10)
    line = lambda: snapshot.status_line(snap.record())  # noqa: E731
    assert line().endswith("the live code matches it")
    os.utime(checkout / "new.py", ns=(1, 1))  # touched, same content: read, hashed, still the same
    assert line().endswith("the live code matches it")
    (checkout / "pkg" / "mod.py").write_text("VERSION = 'edited'\n")
    (checkout / "added.py").write_text("")
    (checkout / "new.py").unlink()
    assert "differs (1 changed (pkg/mod.py); 1 added (added.py); 1 removed (new.py))" in line()
    assert "no snapshot" in snapshot.status_line(None)


def test_a_snapshot_over_the_limit_is_refused_with_the_largest_directories(checkout, tmp_path):
    (checkout / "assets").mkdir()
    (checkout / "assets" / "weights.pt").write_bytes(b"\1" * 300_000)
    git(checkout, "add", "assets")  # tracked: copied whatever its size, so it counts
    with pytest.raises(codefiles.SnapshotError) as err:
        snapshot.take(codefiles.source_of(str(checkout), checkout), tmp_path / "run", max_mb=0.2)
    assert "over run.snapshot_max_mb=0.2" in str(err.value) and "assets/ 0 MB" in str(err.value)
    assert "--no-snapshot" in str(err.value)
    store = snapcache.store_of(tmp_path / "run")
    assert not store.exists() or not any(store.iterdir())


def test_without_git_the_working_directory_is_copied_without_hidden_and_virtualenv_directories(tmp_path):
    work = tmp_path / "work"
    for rel in ("train.py", "lib/util.py", ".hidden/x.py", "venv/lib/y.py", "lib/__pycache__/u.pyc"):
        (work / rel).parent.mkdir(parents=True, exist_ok=True)
        (work / rel).write_text("")
    (work / "venv" / "pyvenv.cfg").write_text("home = /usr\n")
    snap = snapshot.take(codefiles.source_of(None, work), tmp_path / "run", max_mb=10)
    assert files_in(snap.dir) == ["lib/util.py", "train.py"] and not snap.source.git


def earlier_runs(tree: Path) -> None:
    """What earlier submissions leave inside a code tree: a run directory with a checkpoint, a sweep
    directory deeper down with its point, and beside them a manifest.json of the user's own."""
    from hpc.rundir.run import RunDir
    from hpc.rundir.sweepdir import SweepDir

    run = RunDir(tree / "runs" / "old")
    run.start("p", "a: 1\n", "local")
    (run.path / "main" / "checkpoints" / "step-1").mkdir(parents=True)
    (run.path / "main" / "checkpoints" / "step-1" / "model.pt").write_bytes(b"\0" * 4096)
    sweep = SweepDir(tree / "exp" / "deep" / "grid")
    sweep.save("p", {"p.x": [1]}, [], None, [])
    point = RunDir(sweep.path / "abc123")
    point.start("p", "x: 1\n", "local")
    (point.path / "main").mkdir()
    (point.path / "main" / "done").write_text("{}")
    (tree / "web").mkdir()
    (tree / "web" / "manifest.json").write_text('{"name": "an app", "tasks": []}')  # not hpc's: code


def test_without_git_earlier_run_and_sweep_directories_are_not_copied(tmp_path):
    tree = tmp_path / "proj"
    (tree / "pkg").mkdir(parents=True)
    (tree / "pkg" / "mod.py").write_text("x = 1\n")
    earlier_runs(tree)
    snap = snapshot.take(codefiles.source_of(None, tree, [tmp_path / "new"]), tmp_path / "new", max_mb=10)
    assert files_in(snap.dir) == ["pkg/mod.py", "web/manifest.json"]


def test_in_a_checkout_untracked_run_and_sweep_directories_are_not_copied(checkout, tmp_path):
    earlier_runs(checkout)
    from hpc.rundir.run import RunDir

    hidden = RunDir(checkout / "out" / "hidden")  # its manifest ignored, its checkpoint not
    hidden.start("p", "a: 1\n", "local")
    (hidden.path / "ckpt.pt").write_bytes(b"\0" * 4096)
    (checkout / ".gitignore").write_text("ignored/\nmanifest.json\n")
    snap = snapshot.take(codefiles.source_of(str(checkout), checkout, [tmp_path / "new"]), tmp_path / "new",
                         max_mb=10)
    assert files_in(snap.dir) == [".gitignore", "link.py", "new.py", "pkg/__init__.py", "pkg/mod.py", "run.sh"]
    (checkout / ".gitignore").write_text("ignored/\n")
    snap = snapshot.take(codefiles.source_of(str(checkout), checkout, [tmp_path / "new"]), tmp_path / "new",
                         max_mb=10)
    assert "web/manifest.json" in files_in(snap.dir) and not any(
        f.startswith(("runs/", "exp/", "out/")) for f in files_in(snap.dir))


def test_a_tree_that_is_a_run_directory_is_refused(tmp_path):
    from hpc.rundir.run import RunDir

    RunDir(tmp_path / "run").start("p", "a: 1\n", "local")
    with pytest.raises(codefiles.SnapshotError, match="is a run or sweep directory of hpc.*HINT"):
        snapshot.take(codefiles.source_of(None, tmp_path / "run"), tmp_path / "new", max_mb=10)


def test_jobs_run_in_the_snapshot_copy_of_the_submission_directory_and_import_from_it(checkout, tmp_path):
    (checkout / "src" / "lib").mkdir(parents=True)
    (checkout / "src" / "lib" / "__init__.py").write_text("")
    (checkout / "src" / "lib" / "pipe.py").write_text("")
    snap = snapshot.take(codefiles.source_of(str(checkout), checkout), tmp_path / "run", max_mb=10)
    root = codefiles.import_root(str(checkout / "src" / "lib" / "pipe.py"), "lib.pipe")
    assert root == checkout / "src"
    assert codefiles.import_root(str(checkout / "src" / "lib" / "__init__.py"), "lib") == checkout / "src"
    code = snap.job_code(checkout / "pkg", root)
    assert code.cwd == str(snap.dir / "pkg") and code.submit_dir == str(checkout / "pkg")
    assert code.path == (str(snap.dir / "src"), str(snap.dir / "pkg"))
    env = code.environ({"PYTHONPATH": "/elsewhere"})
    assert env["PYTHONPATH"] == os.pathsep.join([*code.path, "/elsewhere"])
    assert env["HPC_CODE_DIR"] == str(snap.dir) and env["HPC_SUBMIT_DIR"] == str(checkout / "pkg")
    outside = snap.job_code(tmp_path, None)  # submitted from outside the checkout: the job stays there
    assert outside.cwd is None and outside.path == ()


def test_entering_the_snapshot_imports_its_copy(checkout, tmp_path):
    snap = snapshot.take(codefiles.source_of(str(checkout), checkout), tmp_path / "run", max_mb=10)
    (checkout / "pkg" / "mod.py").write_text("VERSION = 'live'\n")
    script = ("import sys, pickle; code = pickle.loads(bytes.fromhex(sys.argv[1])); code.enter(); "
              "import os, pkg.mod; print(pkg.mod.VERSION, os.getcwd())")
    import pickle

    out = subprocess.run([sys.executable, "-c", script, pickle.dumps(snap.job_code(checkout)).hex()],
                         cwd=checkout, capture_output=True, text=True, check=True).stdout.split()
    assert out == ["uncommitted", str(snap.dir)]


def test_a_job_imports_nothing_from_the_live_tree_and_maps_its_pythonpath(tmp_path, monkeypatch):
    """The job's interpreter starts in the live submit directory (`python -m` puts it on sys.path):
    entering the snapshot takes it off, and a PYTHONPATH entry into the live tree points at the copy."""
    from hpc.rundir.snapshot import JobCode

    live, snap = tmp_path / "live", tmp_path / "code" / "abc"
    (live / "src").mkdir(parents=True)
    (snap / "src").mkdir(parents=True)
    (live / "only_live.py").write_text("X = 1\n")
    code = JobCode(str(snap), "abc", str(live), str(snap), (str(snap),))
    monkeypatch.chdir(live)
    monkeypatch.setattr(sys, "path", [str(live), "", *sys.path])
    code.enter()
    assert str(live) not in sys.path and "" not in sys.path and sys.path[0] == str(snap)
    with pytest.raises(ImportError):
        __import__("only_live")
    env = code.environ({"PYTHONPATH": os.pathsep.join([str(live / "src"), str(live / "gone"), "rel", "/opt/x"])})
    assert env["PYTHONPATH"].split(os.pathsep) == [str(snap), str(snap / "src"), "rel", "/opt/x"]
