"""The commit and checkout a submission records (hpc.rundir.codeversion), read from git's files without
a git process: each layout must give what `git rev-parse HEAD --show-toplevel` gives, or ask git."""
from __future__ import annotations

import subprocess

import pytest

from hpc.rundir import codeversion
from hpc.rundir.codeversion import GIT_HEAD, code_version


def git(where, *args):
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "init.defaultBranch=main",
                           *args], cwd=where, check=True, capture_output=True, text=True).stdout.strip()


def rev_parse(where):
    out = subprocess.run(GIT_HEAD, cwd=where, capture_output=True, text=True)
    lines = out.stdout.split("\n")
    return (lines[0], lines[1]) if out.returncode == 0 and len(lines) > 1 else (None, None)


@pytest.fixture
def no_git_process(monkeypatch):
    """Fails a test whose reading ran git: the layouts here are read from git's files alone."""
    def refuse(place):
        raise AssertionError(f"git was run for {place}")
    monkeypatch.setattr(codeversion, "_ask_git", refuse)
    for name in codeversion.GIT_SETTINGS:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def repo(tmp_path):
    root = tmp_path / "repo"
    (root / "pkg" / "deep").mkdir(parents=True)
    (root / "pkg" / "deep" / "mod.py").write_text("x = 1\n")
    git(root, "init", "-q")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "one")
    return root


def test_a_branch_a_packed_ref_a_detached_head_and_a_worktree_read_as_git_reads_them(repo, tmp_path, no_git_process):
    deep = repo / "pkg" / "deep"
    assert codeversion.git_head(deep) == rev_parse(deep) == (git(repo, "rev-parse", "HEAD"), str(repo))
    git(repo, "commit", "-q", "--allow-empty", "-m", "two")
    git(repo, "pack-refs", "--all")  # the branch now lives in packed-refs only
    assert not (repo / ".git" / "refs" / "heads" / "main").exists()
    assert codeversion.git_head(deep) == rev_parse(deep)
    git(repo, "checkout", "-q", "--detach", "HEAD~1")
    assert codeversion.git_head(repo) == rev_parse(repo)
    git(repo, "worktree", "add", "-q", "-b", "side", str(tmp_path / "wt"), "main")
    git(tmp_path / "wt", "commit", "-q", "--allow-empty", "-m", "three")
    assert codeversion.git_head(tmp_path / "wt" / "pkg") == rev_parse(tmp_path / "wt" / "pkg")
    assert codeversion.git_head(tmp_path / "wt")[1] == str(tmp_path / "wt")
    assert code_version(None, tmp_path)["git_commit"] is None  # not a checkout


def test_what_the_files_do_not_say_is_asked_of_git(tmp_path, monkeypatch):
    empty = tmp_path / "unborn"
    empty.mkdir()
    git(empty, "init", "-q")  # no commit yet: git rev-parse HEAD fails, and so does the reading
    asked = []
    monkeypatch.setattr(codeversion, "_ask_git", lambda place: asked.append(place) or rev_parse(place))
    assert codeversion.git_head(empty) == (None, None) and asked == [empty]
    monkeypatch.setenv("GIT_DIR", str(empty / ".git"))  # git's own variables: git decides
    codeversion.git_head(empty)
    assert asked == [empty, empty]
