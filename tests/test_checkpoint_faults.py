"""Fault injection against the checkpoint store and resume: kills, a full disk, racing readers, a
second writer, malformed entries, a dropout model stopped and resumed.

    python -m pytest tests/test_checkpoint_faults.py -q

The campaigns are the faults package (the reliability report runs them with large counts); here they
run with small ones, next to deterministic cases that put the writer exactly where a race would.
"""

import random
import signal
import warnings

import pytest
import torch

import hpc.checkpoint.reader
from faults import checkpoint as fc
from faults import disk, resume
from faults.common import consistency, expected_state
from hpc.checkpoint import CheckpointStore


@pytest.fixture(autouse=True)
def _no_slurm_job(monkeypatch):
    # a test run inside an allocation must not name that job as the stores' writer
    for name in ("SLURM_JOB_ID", "SLURM_RESTART_COUNT", "TORCHELASTIC_RUN_ID"):
        monkeypatch.delenv(name, raising=False)


# ------------------------------------------------------------------ kills during saves
@pytest.mark.parametrize("mode", fc.WRITER_MODES)
def test_sigkill_at_random_points_of_saves_loses_no_committed_checkpoint(tmp_path, mode):
    outcome = fc.sigkill_saves(tmp_path, kills=12, seed=7, mode=mode)
    assert (outcome.faults, outcome.lost) == (12, 0), outcome.detail


@pytest.mark.parametrize("point", fc.KILL_POINTS)
@pytest.mark.parametrize("mode", fc.WRITER_MODES)
def test_a_kill_at_the_renames_of_a_resave_is_recovered_and_told_truthfully(tmp_path, mode, point):
    """A re-saved step swaps two directories with two renames; killed in between, the complete new
    copy loads (no warning calls it markerless) and the next writer finishes the swap."""
    assert fc.resave_problem(tmp_path, mode, point) == ""


# ------------------------------------------------------------------ keep-k by validity
def test_invalid_newer_directories_never_push_out_the_fresh_commit(tmp_path):
    """A run resumed from step 4 because steps 8 and 9 lost their markers: with keep=2 its commit
    of step 5 used to be pruned at once (8 and 9 counted), leaving nothing to load."""
    earlier = CheckpointStore(tmp_path, keep=3)
    for step in (4, 8, 9):
        earlier.save(step, expected_state(step), blocking=True)
    earlier.close()
    store = CheckpointStore(tmp_path, keep=2)
    for step in (8, 9):
        (tmp_path / f"step-{step}" / "COMPLETE.json").unlink()
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        assert store.load()["step"] == 4
        store.save(5, expected_state(5), blocking=True)
    state = store.load()
    assert consistency(state) == "" and state["step"] == 5
    assert store.load(step=4)["step"] == 4  # two valid ones kept: 4 and 5
    assert any("step-8" in str(w.message) and "set aside" in str(w.message) for w in said)
    for step in range(6, 12):
        store.save(step, expected_state(step), blocking=True)
        assert (tmp_path / ".step-8.invalid").is_dir() == (step < 10)  # kept while no 2 newer valid
    store.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == [".writer.lock", "step-10", "step-11"]


# ------------------------------------------------------------------ a full disk
def test_full_disk_says_no_space_removes_partial_writes_and_recovers(tmp_path):
    """One round per writer mode on an 8 MiB tmpfs: the failing save says "no space left" with the
    bytes needed and free, leaves no partial file, the previous checkpoint loads, and the next save
    works once space is back."""
    try:
        outcome = disk.full_disk(tmp_path, rounds=3, seed=1)
    except disk.MountRefused as err:
        pytest.skip(f"no small filesystem to fill: {err}")
    assert (outcome.faults, outcome.lost) == (3, 0), outcome.detail


def test_full_disk_in_a_user_namespace(tmp_path):
    """The fallback where mount is refused to the process itself (a container without
    CAP_SYS_ADMIN): the campaign runs in a child inside a user and mount namespace."""
    try:
        outcome = disk.full_disk(tmp_path, rounds=1, seed=2, namespace=True)
    except disk.MountRefused as err:
        pytest.skip(f"no user namespace with a tmpfs here: {err}")
    assert (outcome.faults, outcome.lost) == (1, 0), outcome.detail
    assert "user namespace" in outcome.detail


# ------------------------------------------------------------------ readers during pruning
@pytest.mark.parametrize("moment", ["opening rank-0.pt", "mapping shared.pt"])
def test_a_read_whose_checkpoint_is_pruned_meanwhile_reads_the_new_one(tmp_path, monkeypatch, moment):
    """The reader has verified step 1 when the writer (keep=1) commits step 2 and deletes step 1:
    before the reader opens its rank file (FileNotFoundError), or between torch.load's open of
    shared.pt and its memory map by name (a RuntimeError). The load returns step 2, whole."""
    writer = CheckpointStore(tmp_path, keep=1)
    writer.save(1, expected_state(1), blocking=True)
    pruned = []

    def prune_once(path):
        if not pruned:
            pruned.append(path)
            writer.save(2, expected_state(2), blocking=True)

    if moment == "opening rank-0.pt":
        real_load = hpc.checkpoint.reader.load_file

        def racing_load(path, *args, **kwargs):
            prune_once(path) if path.name == "rank-0.pt" else None
            return real_load(path, *args, **kwargs)

        monkeypatch.setattr(hpc.checkpoint.reader, "load_file", racing_load)
    else:
        real_map = torch.UntypedStorage.from_file

        def racing_map(path, *args, **kwargs):
            prune_once(path)
            return real_map(path, *args, **kwargs)

        monkeypatch.setattr(torch.UntypedStorage, "from_file", racing_map)
    state = CheckpointStore(tmp_path).load()
    writer.close()
    assert pruned and "step-1" in str(pruned[0])
    assert consistency(state) == "" and state["step"] == 2


def test_concurrent_readers_during_pruning_always_get_a_complete_checkpoint(tmp_path):
    outcome = fc.readers_during_prune(tmp_path, loads=300, seed=3)
    assert outcome.lost == 0, outcome.detail
    assert outcome.faults >= 1, outcome.detail  # the writer pruned under the readers at least once


# ------------------------------------------------------------------ malformed entries
@pytest.mark.parametrize("kind", ["marker []", "marker null", "marker directory", "shared.pt directory",
                                  "regular file", "random bytes marker"])
def test_a_malformed_entry_is_skipped_and_removed_by_the_next_save(tmp_path, kind):
    assert fc.malformed_problem(tmp_path, {2: kind}, random.Random(0)) == ""


def test_random_malformed_entries(tmp_path):
    outcome = fc.malformed_entries(tmp_path, cases=20, seed=4)
    assert (outcome.faults, outcome.lost) == (20, 0), outcome.detail


# ------------------------------------------------------------------ two writers
def test_a_second_writer_is_refused_naming_the_holder_and_a_dead_holder_blocks_nobody(tmp_path):
    """Rounds alternate the second job's rank 0 and rank 1; then the holder is SIGKILLed."""
    outcome = fc.two_writers(tmp_path, rounds=2, seed=5)
    assert (outcome.faults, outcome.lost) == (4, 0), outcome.detail


# ------------------------------------------------------------------ dropout resume
@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    directory = tmp_path_factory.mktemp("clean")
    resume.Victim(resume.train, directory).finish()
    return resume.weights(directory)


@pytest.mark.parametrize("sig, stop_at, mode", [(signal.SIGTERM, 7, "thread"), (signal.SIGKILL, 14, "fork"),
                                                (signal.SIGTERM, 13, "fork")])
def test_dropout_and_augmentation_model_resumes_bitwise(tmp_path, uninterrupted, sig, stop_at, mode):
    """Dropout and augmentation draw from the global RNG, data comes from s.loader through
    TrainLoop; stopped mid-epoch and resumed, the parameters equal the uninterrupted run's."""
    assert resume.trial(tmp_path, stop_at, sig, mode, uninterrupted) == ""
    assert all(torch.equal(a, b) for a, b in zip(resume.weights(tmp_path), uninterrupted))


# ------------------------------------------------------------------ the report
def test_reliability_report_counts_faults_and_never_passes_a_campaign_that_did_not_run(tmp_path, monkeypatch):
    from faults import reliability

    def refused(scratch, count, seed):
        raise disk.MountRefused("mount: permission denied")

    monkeypatch.setattr(reliability, "campaigns", lambda: [
        reliability.Campaign("malformed step-N entries", fc.malformed_entries, 50, 3),
        reliability.Campaign("full disk", refused, 15, 3)])
    out = tmp_path / "R.md"
    assert reliability.main(["--quick", "--out", str(out)]) == 0
    text = out.read_text()
    assert text.startswith("# Reliability\n") and "Produced by `python -m faults.reliability --quick`" in text
    assert "| malformed step-N entries | 3 | 0 |" in text
    assert "| full disk | not run | - |" in text and "mount: permission denied" in text
    assert "| **total** | **3** | **0** |" in text
    assert "- met: 0 lost over 3 injected faults" in text
    assert "- NOT met: every campaign ran (not run: full disk)" in text and "Outcome: **NOT met**" in text
