"""Unit tests for hpc.checkpoint.CheckpointStore (local filesystem, real torch files)."""

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import warnings
from pathlib import Path

import pytest
import torch

from hpc.checkpoint import CheckpointStore
from hpc.checkpoint.staging import Staging

MODES = pytest.mark.parametrize("mode", ["fork", "thread"])


def _state(step, n=8):
    g = torch.Generator().manual_seed(step)
    return {"model": {"w": torch.randn(n, generator=g)}, "step": step, "epoch": step // 10,
            "per_rank": {"pos": step * 2}}


def test_first_run_has_nothing_to_load(tmp_path):
    store = CheckpointStore(tmp_path)
    assert store.latest() is None
    assert store.load() is None


@MODES
def test_roundtrip_and_keep_latest(tmp_path, mode):
    store = CheckpointStore(tmp_path, keep=2, mode=mode)
    for step in (10, 20, 30):
        store.save(step, _state(step))
    store.close()
    assert store.steps() == [20, 30]
    assert store.latest() == 30
    got = store.load()
    assert got["step"] == 30 and got["per_rank"] == {"pos": 60}
    assert torch.equal(got["model"]["w"], _state(30)["model"]["w"])
    assert store.load(step=20)["step"] == 20


@MODES
def test_save_copies_before_returning(tmp_path, mode):
    """The caller may change its tensors right after save(): the checkpoint keeps the old values,
    also for the second save (thread mode reuses its buffers)."""
    store = CheckpointStore(tmp_path, mode=mode)
    w = torch.zeros(4_000_000)
    for step in (1, 2):
        store.save(step, {"w": w, "per_rank": {"v": w[:3]}})
        w.add_(1)
    store.close()
    assert torch.equal(store.load(step=1)["w"], torch.zeros(4_000_000))
    got = store.load(step=2)
    assert torch.equal(got["w"], torch.ones(4_000_000)) and torch.equal(got["per_rank"]["v"], torch.ones(3))


def test_corrupted_newest_is_skipped_with_warning(tmp_path):
    store = CheckpointStore(tmp_path)
    store.save(1, _state(1), blocking=True)
    store.save(2, _state(2), blocking=True)
    shared = tmp_path / "step-2" / "shared.pt"
    data = bytearray(shared.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shared.write_bytes(bytes(data))
    with pytest.warns(RuntimeWarning, match=r"step-2.*crc32 checksum"):
        got = store.load()
    assert got["step"] == 1
    assert store.latest() == 1


def test_missing_marker_and_incomplete_tmp_are_skipped(tmp_path):
    store = CheckpointStore(tmp_path)
    store.save(1, _state(1), blocking=True)
    store.save(2, _state(2), blocking=True)
    (tmp_path / "step-2" / "COMPLETE.json").unlink()
    (tmp_path / ".step-3.tmp").mkdir()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert store.load()["step"] == 1
    text = " ".join(str(w.message) for w in caught)
    assert "step-2" in text and "no completion marker" in text and ".step-3.tmp" in text


def test_resaving_a_step_replaces_it(tmp_path):
    store = CheckpointStore(tmp_path)
    store.save(5, {"v": 1}, blocking=True)
    store.save(5, {"v": 2}, blocking=True)
    assert store.load()["v"] == 2


class Evil:
    def __reduce__(self):
        return (os.system, ("echo pwned",))


def test_loading_never_runs_pickled_code(tmp_path):
    store = CheckpointStore(tmp_path)
    store.save(1, {"x": Evil()}, blocking=True)
    with pytest.raises(ValueError, match="weights_only.*HINT"):
        store.load()


def _save_two_ranks(directory, step):
    """Ranks 0 and 1 of one store, each on its own thread, save `step` blocking; returns the stores
    and each rank's thread (the object: a finished thread's ident is reused by the next one)."""
    stores = [CheckpointStore(directory, rank=r, world_size=2) for r in range(2)]
    idents = {}

    def run(r):
        idents[r] = threading.current_thread()
        stores[r].save(step, {"model": torch.ones(3), "per_rank": {"rank": r}}, blocking=True)

    threads = [threading.Thread(target=run, args=(r,)) for r in (1, 0)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return stores, idents


def test_per_rank_state_two_ranks(tmp_path):
    stores, _ = _save_two_ranks(tmp_path, 7)
    assert sorted(p.name for p in (tmp_path / "step-7").iterdir()) == [
        "COMPLETE.json", "files-0.json", "files-1.json", "rank-0.pt", "rank-1.pt",
        "shared.pt"]  # rank 1's report to rank 0 is gone; each rank's list of its files is committed
    assert [s.load()["per_rank"] for s in stores] == [{"rank": 0}, {"rank": 1}]
    assert torch.equal(stores[1].load()["model"], torch.ones(3))


def test_a_rank_fsyncs_only_its_own_file_per_save(tmp_path, monkeypatch):
    """Each fsync waits for the disk's journal, and at hundreds of ranks they queue behind one
    another: a rank > 0 fsyncs only the data it wrote (its state and the list of its files that
    the marker names); its report to rank 0 is a message that the fsynced marker repeats. Rank 0
    does not report to itself through a file."""
    import os
    calls = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (calls.append(threading.current_thread()), real(fd))[1])
    stores, idents = _save_two_ranks(tmp_path, 3)
    assert calls.count(idents[1]) == 2  # rank-1.pt, files-1.json
    assert not (tmp_path / "step-3" / "rank-0.done").exists()
    assert [s.load()["per_rank"] for s in stores] == [{"rank": 0}, {"rank": 1}]


def test_stale_rank_file_of_an_earlier_attempt_is_not_committed(tmp_path, monkeypatch):
    import hpc.checkpoint.store as ck
    monkeypatch.setattr(ck, "RANK_WAIT_S", 0.3)
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "0")
    CheckpointStore(tmp_path, rank=1, world_size=2).save(3, {"per_rank": {"old": 1}}, blocking=True)
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")  # requeued: rank 1 has not written yet
    with pytest.raises(TimeoutError, match="rank 1"):
        CheckpointStore(tmp_path, rank=0, world_size=2).save(3, {"per_rank": {}}, blocking=True)
    assert not (tmp_path / "step-3").exists()


@MODES
def test_background_write_does_not_block_and_errors_surface(tmp_path, mode):
    store = CheckpointStore(tmp_path, mode=mode)
    big = {"w": torch.zeros(16_000_000)}  # 64 MB
    t0 = time.perf_counter()
    store.save(1, big)
    returned = time.perf_counter() - t0
    store.wait()
    total = time.perf_counter() - t0
    assert store.stats["write_s"] > 0 and returned < total
    (tmp_path / ".step-2.tmp").write_text("a file where a directory must go")
    store.save(2, {"w": 1})
    with pytest.raises(RuntimeError, match="background checkpoint write"):
        store.wait()


def test_staging_copies_into_reused_buffers():
    staging = Staging()
    src = {"a": [torch.ones(2), (torch.zeros(1), 3)], "b": "x"}
    cp = staging.stage(src, cpu_too=True)
    src["a"][0].add_(1)
    assert torch.equal(cp["a"][0], torch.ones(2)) and cp["a"][1][1] == 3 and cp["b"] == "x"
    again = staging.stage(src, cpu_too=True)
    assert again["a"][0] is cp["a"][0] and torch.equal(again["a"][0], 2 * torch.ones(2))
    src["a"][0] = torch.ones(5)  # another shape: a new buffer
    assert staging.stage(src, cpu_too=True)["a"][0].shape == (5,)
    assert staging.stage(src, cpu_too=False)["a"][0] is src["a"][0]  # CPU tensors pass through


def test_truncated_file_is_skipped(tmp_path):
    store = CheckpointStore(tmp_path)
    store.save(1, _state(1), blocking=True)
    store.save(2, _state(2), blocking=True)
    shared = tmp_path / "step-2" / "shared.pt"
    shared.write_bytes(shared.read_bytes()[:-10])
    with pytest.warns(RuntimeWarning, match=r"step-2.*truncated"):
        assert store.load()["step"] == 1


def test_marker_of_the_sha256_format_still_loads(tmp_path):
    """Checkpoints written before the crc32 markers (sha256 hex per file) stay resumable."""
    import hashlib
    import json

    store = CheckpointStore(tmp_path)
    store.save(1, _state(1), blocking=True)
    marker_path = tmp_path / "step-1" / "COMPLETE.json"
    marker = json.loads(marker_path.read_text())
    step_dir = tmp_path / "step-1"
    (step_dir / "files-0.json").unlink()  # a marker of that format lists every file itself
    marker["files"] = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in step_dir.iterdir()
                       if p.name != "COMPLETE.json"}
    marker_path.write_text(json.dumps(marker))
    assert store.load()["step"] == 1
    marker["files"]["shared.pt"] = "0" * 64
    marker_path.write_text(json.dumps(marker))
    with pytest.warns(RuntimeWarning, match="sha256"):
        assert store.load() is None


def test_forked_writer_survives_sigterm_and_reports_failures(tmp_path):
    """A preemption's SIGTERM reaches every process of the job: the writer must finish anyway."""
    store = CheckpointStore(tmp_path, mode="fork")
    store.save(1, {"w": torch.zeros(50_000_000)})  # 200 MB: still writing when the signal comes
    os.kill(store._job.pid, signal.SIGTERM)
    os.kill(store._job.pid, signal.SIGUSR2)
    store.wait()
    assert store.latest() == 1
    store.save(2, {"w": torch.zeros(50_000_000)})
    os.kill(store._job.pid, signal.SIGKILL)
    with pytest.raises(RuntimeError, match="background checkpoint write") as info:
        store.wait()
    assert "killed by signal 9" in str(info.value.__cause__)
    assert store.latest() == 1


WRITER = textwrap.dedent("""
    import sys, torch
    from hpc.checkpoint import CheckpointStore
    store = CheckpointStore(sys.argv[1])
    store.save(1, {"w": torch.ones(10)}, blocking=True)
    print("saved", flush=True)
    store.save(2, {"w": torch.zeros(100_000_000)}, blocking=True)  # 400 MB, killed during it
""")


def test_sigkill_during_write_leaves_previous_loadable(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path)], stdout=subprocess.PIPE,
                            text=True)
    assert proc.stdout.readline().strip() == "saved"
    deadline = time.monotonic() + 60
    while not (tmp_path / ".step-2.tmp").exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (tmp_path / "step-2").exists()
    with pytest.warns(RuntimeWarning, match="incomplete"):
        got = CheckpointStore(tmp_path).load()
    assert torch.equal(got["w"], torch.ones(10))


def test_auto_mode_forks_only_for_large_states(tmp_path, monkeypatch):
    from hpc.checkpoint import store as store_module
    from hpc.checkpoint.background_writer import ForkJob, ThreadJob

    monkeypatch.setattr(store_module, "AUTO_FORK_BYTES", 32 * 2**20)  # the rule, not the constant
    store = CheckpointStore(tmp_path)
    store.save(1, {"w": torch.zeros(1000)})
    assert isinstance(store._job, ThreadJob)
    store.save(2, {"w": torch.zeros(10_000_000)})  # 40 MB >= AUTO_FORK_BYTES
    assert isinstance(store._job, ForkJob)
    store.close()
    assert store.steps() == [1, 2] and torch.equal(store.load()["w"], torch.zeros(10_000_000))


def test_a_hung_forked_writer_is_killed_at_its_deadline():
    import time

    from hpc.checkpoint import background_writer as background

    t0 = time.monotonic()
    job = background.ForkJob(time.sleep, (60,), timeout_s=0.5)
    with pytest.raises(RuntimeError, match="killed"):
        job.wait()
    assert time.monotonic() - t0 < 10


def test_each_checkpoint_module_stays_small():
    """One concept per module: no module of the hpc.checkpoint package is over 300 lines."""
    import hpc.checkpoint

    package = Path(hpc.checkpoint.__file__).parent
    sizes = {p.name: len(p.read_text().splitlines()) for p in package.glob("*.py")}
    assert len(sizes) > 5 and max(sizes.values()) <= 300, sizes


def test_a_store_without_sharded_state_never_imports_dcp(tmp_path):
    """torch.distributed.checkpoint costs about 1 s of CPU per process to import: a store that saves
    and loads plain state (every users'-script hook, a stage without a model) must not pay it."""
    code = textwrap.dedent(f"""
        import sys
        from hpc.checkpoint import CheckpointStore
        store = CheckpointStore({str(tmp_path)!r}, keep=2)
        store.save(1, {{"x": 1}}, blocking=True)
        assert store.load()["x"] == 1
        store.close()
        loaded = [m for m in sys.modules if m.startswith("torch.distributed.checkpoint")]
        assert not loaded, loaded
    """)
    subprocess.run([sys.executable, "-c", code], check=True)
