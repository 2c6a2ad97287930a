"""The resume contract for unmodified scripts (hpc.scripts.resume) and hpc's rule for a complete
checkpoint (hpc.checkpoint.complete)."""

import json
import os
import struct
import time
import zipfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hpc.checkpoint.complete import is_complete, step_of
from hpc.scripts import resume

ATTEMPT = {"job": "7", "restart": "1"}


def zip_file(path: Path, payload: bytes = b"x" * 1000) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("archive/data.pkl", payload)
    return path


def safetensors(path: Path, n: int = 16) -> Path:
    header = json.dumps({"w": {"dtype": "F32", "shape": [n // 4], "data_offsets": [0, n]}}).encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * n)
    return path


def hf_checkpoint(root: Path, step: int, finished: bool = True) -> Path:
    d = root / f"checkpoint-{step}"
    safetensors(d / "model.safetensors")
    zip_file(d / "optimizer.pt")
    if finished:
        (d / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    return d


def test_a_torch_save_file_cut_anywhere_is_incomplete(tmp_path):
    whole = zip_file(tmp_path / "ckpt.pt", os.urandom(5000)).read_bytes()
    assert is_complete(tmp_path / "ckpt.pt") == (True, "")
    for cut in (0, 10, len(whole) // 2, len(whole) - 1):
        (tmp_path / "cut.pt").write_bytes(whole[:cut])
        ok, why = is_complete(tmp_path / "cut.pt")
        assert not ok and "cut.pt" in why


def test_directories_need_their_frameworks_last_file_and_no_work_in_progress(tmp_path):
    assert is_complete(hf_checkpoint(tmp_path, 10))[0]
    ok, why = is_complete(hf_checkpoint(tmp_path, 20, finished=False))
    assert not ok and "trainer_state.json" in why
    dcp = tmp_path / "step-5"
    dcp.mkdir()
    (dcp / "__0_0.distcp").write_bytes(b"shard")
    assert "metadata" in is_complete(dcp)[1]
    (dcp / ".metadata").write_bytes(b"meta")
    assert is_complete(dcp)[0]
    acc = tmp_path / "checkpoints" / "checkpoint_3"
    safetensors(acc / "model.safetensors")
    assert "random_states_0.pkl" in is_complete(acc)[1]
    (acc / "random_states_0.pkl").write_bytes(b"rng")
    (acc / "checkpoint-is-incomplete.txt").write_text("")
    assert "still being written" in is_complete(acc)[1]


def test_a_truncated_safetensors_file_is_incomplete(tmp_path):
    whole = safetensors(tmp_path / "m.safetensors", 64).read_bytes()
    (tmp_path / "m.safetensors").write_bytes(whole[:-1])
    assert not is_complete(tmp_path / "m.safetensors")[0]


@settings(max_examples=50, deadline=None)
@given(st.binary(max_size=300))
def test_any_bytes_get_an_answer_not_an_error(tmp_path_factory, data):
    p = tmp_path_factory.mktemp("b") / "x.safetensors"
    p.write_bytes(data)
    ok, why = is_complete(p)
    assert isinstance(ok, bool) and (ok or why)


def test_placeholders_expand_in_every_argument_and_only_hpcs_own():
    values = {"HPC_WORK_DIR": "/w", "HPC_LAST_CHECKPOINT": "/w/out/checkpoint-5"}
    assert resume.expand(["--out=$HPC_WORK_DIR/out", "${HPC_LAST_CHECKPOINT}", "$HOME", "$HPC_RUN_DIR"], values) == \
        ["--out=/w/out", "/w/out/checkpoint-5", "$HOME", ""]
    assert resume.unknown_placeholders(["$HPC_WORKDIR", "${HPC_LAST_CHECKPOINT}", "$PATH"]) == ["HPC_WORKDIR"]


def test_the_newest_complete_checkpoint_is_chosen_and_incomplete_ones_set_aside(tmp_path):
    work, task = tmp_path / "work", tmp_path
    for step in (5, 10):
        hf_checkpoint(work / "out", step)
    hf_checkpoint(work / "out", 15, finished=False)  # killed during its save
    plan = resume.plan("out/checkpoint-*", work, task, ATTEMPT)
    assert plan["last"] == str(work / "out" / "checkpoint-10")
    [(before, after, why)] = plan["set_aside"]
    assert before.endswith("checkpoint-15") and after == str(task / "incomplete" / "checkpoint-15.7-1")
    assert Path(after, "model.safetensors").exists() and not Path(before).exists()  # moved, not deleted
    assert resume.plan("out/none-*", work, task, ATTEMPT) == {"last": None, "set_aside": [], "restored": None}


def test_names_order_by_their_number_not_as_text(tmp_path):
    for step in (999, 1000):
        hf_checkpoint(tmp_path, step)
    assert [p.name for p in resume.matches("checkpoint-*", tmp_path)] == ["checkpoint-999", "checkpoint-1000"]
    assert step_of(Path("hpc_ckpt_12.ckpt")) == 12 and step_of(Path("last.ckpt")) == -1


def test_a_checkpoint_overwritten_in_place_is_kept_and_put_back_after_a_kill_mid_save(tmp_path):
    work, task = tmp_path / "work", tmp_path
    ckpt = zip_file(work / "out" / "ckpt.pt", b"version 1" * 100)
    assert resume.plan("out/ckpt.pt", work, task, ATTEMPT)["last"] == str(ckpt)
    kept = task / "kept" / "ckpt.pt"
    assert kept.read_bytes() == ckpt.read_bytes()
    ckpt.write_bytes(ckpt.read_bytes()[:50])  # the next save, killed halfway
    plan = resume.plan("out/ckpt.pt", work, task, {"job": "7", "restart": "2"})
    assert plan["restored"] == str(kept) and plan["last"] == str(ckpt)
    assert is_complete(ckpt)[0] and b"version 1" in zipfile.ZipFile(ckpt).read("archive/data.pkl")
    assert (task / "incomplete" / "ckpt.pt.7-2").stat().st_size == 50


def test_the_keeper_copies_a_new_version_once_it_is_stable_and_complete(tmp_path):
    ckpt = zip_file(tmp_path / "work" / "ckpt.pt", b"a" * 100)
    keeper = resume.Keeper(ckpt, tmp_path, every_s=3600)
    keeper.look()
    assert keeper.copies == 0  # seen once: it may still be being written
    keeper.look()
    assert keeper.copies == 1 and (tmp_path / "kept" / "ckpt.pt").read_bytes() == ckpt.read_bytes()
    ckpt.write_bytes(ckpt.read_bytes()[:30])
    time.sleep(0.01)
    keeper.look()
    keeper.look()
    assert keeper.copies == 1  # an incomplete version is never kept
    with resume.Keeper(ckpt, tmp_path, every_s=0.01):
        time.sleep(0.1)


def test_a_link_into_the_submit_directory_is_never_moved(tmp_path):
    data = tmp_path / "live" / "checkpoint-1"
    data.mkdir(parents=True)
    (tmp_path / "work").mkdir()
    os.symlink(data, tmp_path / "work" / "checkpoint-1")
    assert resume.plan("checkpoint-*", tmp_path / "work", tmp_path, ATTEMPT)["set_aside"] == []
    assert data.exists()


@pytest.mark.parametrize("pattern", ["out/*.pt", "out/ckpt.pt"])
def test_nothing_to_resume_from_starts_fresh(tmp_path, pattern):
    assert resume.plan(pattern, tmp_path, tmp_path, ATTEMPT)["last"] is None


def test_the_in_script_hook_picks_the_same_checkpoint_and_sets_aside_the_same_way(tmp_path, monkeypatch):
    """hpc.scripts.hooks (inside an HF or Accelerate script) follows the wrapper's resume plan."""
    from hpc.scripts import hooks

    for step in (5, 10):
        hf_checkpoint(tmp_path / "out", step)
    hf_checkpoint(tmp_path / "out", 15, finished=False)
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    monkeypatch.delenv("HPC_SET_ASIDE_DIR", raising=False)
    assert hooks.newest_complete(tmp_path / "out", "checkpoint-*", set_aside=True).name == "checkpoint-10"
    assert (tmp_path / "out" / "checkpoint-15").exists()  # nowhere to put it: left where it is
    monkeypatch.setenv("HPC_SET_ASIDE_DIR", str(tmp_path / "task" / "incomplete"))
    assert hooks.newest_complete(tmp_path / "out", "checkpoint-*", set_aside=True).name == "checkpoint-10"
    assert (tmp_path / "task" / "incomplete" / "checkpoint-15.7-1" / "model.safetensors").exists()
    assert not (tmp_path / "out" / "checkpoint-15").exists()
