"""Each rank reads only its own part of a checkpoint: at a commit, at a resume, and to agree on validity.

    python -m pytest -q tests/test_rank_reads.py

Two gloo ranks run tests/rankreads_workload.py. At a commit, rank 0 makes the marker from the
checksums the ranks report, and no rank reads a shard back, its own included, nor another rank's
DCP index part; at a resume, a rank reads what its
load needs (its own shards at the same world size) once, checking each tensor's bytes against the
marker as they load: within 1.1x its share, metadata included, never the other rank's files. A corrupt
shard that only its own rank reads still makes both
ranks resume from the older checkpoint (one all-reduce of a validity flag).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpc.checkpoint import layout
from hpc.checkpoint.dcp_index import METADATA, rank_metadata
from test_any_resume import launch

WORKLOAD = Path(__file__).with_name("rankreads_workload.py")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("reads")
    launch(2, "save", str(root), workload=WORKLOAD)
    shards = {r: (root / "checkpoints" / "step-3" / f"__{r}_0.distcp").stat().st_size for r in (0, 1)}
    names = sorted(p.name for p in (root / "checkpoints" / "step-3").iterdir())
    launch(2, "resume", str(root), workload=WORKLOAD)
    results = {r: {**json.loads((root / f"save-{r}.json").read_text()),
                   **json.loads((root / f"resume-{r}.json").read_text())} for r in (0, 1)}
    return shards, results, names


@pytest.mark.parametrize("rank", [0, 1])
def test_a_commit_reads_no_shard_back(run, rank):
    """Neither another rank's shards nor its own: the crc32s were taken as the shard was written
    (hpc.checkpoint.shardcrc). What is left are DCP's indexes, the reports and the marker, a few
    tens of kB here against a shard of 6 MB."""
    shards, results, _ = run
    assert results[rank]["commit"] < min(shards.values()) // 20


@pytest.mark.parametrize("rank", [0, 1])
def test_a_commit_reads_no_other_ranks_index_part(run, rank):
    """Rank 0 used to merge every rank's DCP index part into .metadata at the commit: O(ranks x
    tensors), 11 s of CPU at 512 ranks. Each part is now committed as it is, and rank 0 checks
    the ranks' claims of what they wrote (hpc.checkpoint.dcp_claim); of the other rank's files it
    opens only its report."""
    _, results, _ = run
    opened = results[rank]["commit_opened"]
    others = [n for n in opened if layout.rank_of(n) not in (None, rank) and n != layout.rank_report(1)]
    assert not others, opened
    assert METADATA not in opened


@pytest.mark.parametrize("rank", [0, 1])
def test_a_resume_reads_only_what_the_rank_loads(run, rank):
    shards, results, _ = run
    own = shards[rank]
    assert results[rank]["resume"] < 1.1 * own  # one pass: checked while loading


@pytest.mark.parametrize("rank", [0, 1])
def test_a_resume_opens_no_other_ranks_shard(run, rank):
    """FSDP: a rank opens its own shard file only; it holds the rank's copy of the replicated
    values too (AdamW's `step` scalars, hyperparameters). Spread over the ranks, those made every
    rank open every rank's file (O(W) files per rank at resume); all in rank 0's, every rank
    opened that one besides its own."""
    _, results, _ = run
    shards = {name for name in results[rank]["opened"] if name.endswith(".distcp")}
    assert shards == {f"__{rank}_0.distcp"}, shards


@pytest.mark.parametrize("rank", [0, 1])
def test_a_resume_reads_each_metadata_file_once(run, rank):
    """DCP's index part the load needs (the rank's own, on the layout that saved) is checked
    against the marker as it is read, and the marker the store read is what the shards are
    checked against: neither is read twice, no other rank's part at all."""
    _, results, _ = run
    opened = results[rank]["opened"]
    wanted = {"COMPLETE.json", rank_metadata(rank)}
    assert {n: opened.count(n) for n in wanted} == dict.fromkeys(wanted, 1), opened
    assert not [n for n in opened if n.endswith(METADATA) and n not in wanted], opened


@pytest.mark.parametrize("rank", [0, 1])
def test_a_resume_reads_its_own_list_of_files_and_no_other_ranks(run, rank):
    """The crc32s of each rank's tensors are in that rank's list (files-R.json), which the marker
    names: a rank on the layout that saved reads the marker and its own list, once each, whatever
    the world size; the marker once held every rank's crc32s (4.7 MB at 512 ranks x 300 tensors)."""
    _, results, _ = run
    opened = results[rank]["opened"]
    assert [n for n in opened if n.startswith("files-")] == [layout.rank_list(rank)], opened


@pytest.mark.parametrize("rank", [0, 1])
def test_a_resume_makes_no_process_group(run, rank):
    """A load's plan needs nothing from the other ranks, and the ranks agree on its outcome in the
    session's group: a new gloo group (a full mesh of connections) at every resume was for nothing."""
    _, results, _ = run
    assert "new process group" not in results[rank]["opened"]


@pytest.mark.parametrize("rank", [0, 1])
def test_the_ranks_agree_to_skip_a_shard_only_one_of_them_reads(run, rank):
    _, results, _ = run
    assert (results[rank]["first"], results[rank]["second"]) == (3, 2)


def test_a_committed_checkpoint_keeps_only_what_its_marker_lists(run):
    """The ranks' reports are the commit's alone; each rank's shards, its DCP index part, its
    rank-R.pt and its list of them are kept: 4 files per rank, and no merged index."""
    _, _, names = run
    assert names == ["COMPLETE.json", "__0.metadata", "__0_0.distcp", "__1.metadata", "__1_0.distcp", "files-0.json",
                     "files-1.json", "rank-0.pt", "rank-1.pt", "shared.pt"]
