"""Each rank commits the list of its files; the marker names the lists: its size and rank 0's commit
do not grow with ranks x tensors, and a rank's load reads its own list, no other rank's.

    python -m pytest -q tests/test_rank_lists.py

The ranks are played in one process (tests/playranks.py): ranks 1..W-1 run the store's own write
of a rank > 0 (its files, its list, its report to rank 0), then rank 0 saves and commits.
"""

from __future__ import annotations

import json
from pathlib import Path

import playranks
import pytest
import torch
from playranks import no_slurm_job, recording  # noqa: F401  (an autouse fixture: the played ranks are no SLURM job's)

from hpc.checkpoint import SHARDED_KEY, CheckpointStore, layout
from hpc.checkpoint.dcp_engine import ShardCorrupt
from hpc.checkpoint.dcp_index import rank_metadata


def _save(root: Path, step: int, world: int, model: torch.nn.Module) -> list[str]:
    """Ranks 1..world-1 write `step` as the store writes a rank > 0's part, then rank 0 saves and
    commits it; the names of the files rank 0 opened meanwhile."""
    return playranks.save_step(root, step, world, model, per_rank=True)


def _opening(fn):
    """fn()'s result and the names of the files it opened."""
    with recording() as opened:
        return fn(), opened


def _marker(root: Path, step: int = 1) -> dict:
    return json.loads((root / f"step-{step}" / layout.MARKER).read_text())


def test_the_marker_names_one_list_per_rank_and_no_checksum_per_tensor(tmp_path):
    """At 512 ranks of 300 tensors the marker was 4.7 MB, which rank 0 built from every rank's
    report and wrote at each commit. It now holds the shared file and a list per rank: the same
    size for a model of 2 tensors or of 24, and rank 0 opens no rank's list to write it."""
    world, sizes = 6, {}
    for layers in (1, 12):
        root = tmp_path / str(layers)
        opened = _save(root, 1, world, playranks.model(layers))
        assert not [n for n in opened if n.startswith("files-") and not n.startswith(layout.rank_list(0))], opened
        marker = _marker(root)
        assert set(marker["files"]) == {layout.SHARED} | {layout.rank_list(r) for r in range(world)}
        assert not [n for n, info in marker["files"].items() if "items" in info]
        sizes[layers] = len((root / "step-1" / layout.MARKER).read_bytes())
        names = {p.name for p in (root / "step-1").iterdir()}  # the lists' files are kept, reports gone
        assert {f"__{r}_0.distcp" for r in range(world)} | {rank_metadata(r) for r in range(world)} <= names
        assert {layout.rank_state(r) for r in range(world)} <= names and not any(n.endswith(".done") for n in names)
    assert abs(sizes[12] - sizes[1]) <= 2 * world, sizes  # the lists' byte counts may gain a digit
    assert sizes[12] < 100 * (world + 1), sizes


@pytest.mark.parametrize("rank", [0, 3])
def test_a_ranks_load_opens_its_own_list_and_no_other(tmp_path, rank):
    model, world = playranks.model(3), 4
    _save(tmp_path, 1, world, model)
    state, opened = _opening(lambda: CheckpointStore(tmp_path, rank=rank, world_size=world).load())
    assert state["per_rank"] == {"rank": rank} and state[SHARDED_KEY] == tmp_path / "step-1"
    assert [n for n in opened if n.startswith("files-")] == [layout.rank_list(rank)], opened


def test_a_load_that_reads_other_ranks_files_reads_each_of_their_lists_once(tmp_path):
    """Played without FSDP, the ranks split the replicated tensors between them (a DDP save): a
    rank's load reads every rank's shard, so it reads their lists, each once, when it first needs them."""
    model, world = playranks.model(3), 4
    _save(tmp_path, 1, world, model)
    state = CheckpointStore(tmp_path, rank=2, world_size=world).load()
    fresh = torch.nn.Sequential(*(torch.nn.Linear(4, 4) for _ in range(3)))
    _, opened = _opening(lambda: playranks.engine(2, world).load(state[SHARDED_KEY], fresh, files=state["marker_files"]))
    assert all(torch.equal(a, b) for a, b in zip(fresh.state_dict().values(), model.state_dict().values()))
    lists = sorted(n for n in opened if n.startswith("files-"))
    assert lists == sorted(layout.rank_list(r) for r in range(world) if r != 2), opened


def test_a_rank_the_save_had_not_finds_the_shards_through_the_first_ranks_list(tmp_path):
    """A resume on more ranks: rank 5 of 8 has no list in a checkpoint of 4 ranks."""
    _save(tmp_path, 1, 4, playranks.model(3))
    state, opened = _opening(lambda: CheckpointStore(tmp_path, rank=5, world_size=8).load())
    assert state[SHARDED_KEY] == tmp_path / "step-1" and state["per_rank"] is None
    assert [n for n in opened if n.startswith("files-")] == [layout.rank_list(0)], opened


@pytest.mark.parametrize("fault", ["corrupted", "truncated", "missing"])
def test_a_broken_list_makes_its_ranks_load_fall_back_to_the_older_checkpoint(tmp_path, fault):
    model, world = playranks.model(3), 3
    for step in (1, 2):
        _save(tmp_path, step, world, model)
    path = tmp_path / "step-2" / layout.rank_list(1)
    data = bytearray(path.read_bytes())
    if fault == "corrupted":
        data[len(data) // 2] ^= 0x01  # same size: only its checksum tells
        path.write_bytes(bytes(data))
    elif fault == "truncated":
        path.write_bytes(bytes(data[:-3]))
    else:
        path.unlink()
    with pytest.warns(RuntimeWarning, match=rf"skipping checkpoint .*step-2: files-1\.json .*{fault}"):
        state = CheckpointStore(tmp_path, rank=1, world_size=world).load()
    assert state["step"] == 1 and state["per_rank"] == {"rank": 1}
    assert CheckpointStore(tmp_path, rank=2, world_size=world).load()["step"] == 2  # rank 1's list unread
    state = CheckpointStore(tmp_path, rank=0, world_size=world).load()
    with pytest.raises(ShardCorrupt, match=r"files-1\.json"):  # a load that reads rank 1's shards
        playranks.engine(0, world).load(state[SHARDED_KEY], playranks.model(3), files=state["marker_files"])


def test_a_checkpoint_whose_marker_lists_every_file_still_loads_and_verifies(tmp_path):
    """Checkpoints committed before the lists: the marker names every rank's files itself."""
    model, world = playranks.model(3), 3
    _save(tmp_path, 1, world, model)
    step, marker = tmp_path / "step-1", _marker(tmp_path)
    marker["files"] = dict(layout.check(step, crc=())[1])
    for r in range(world):
        del marker["files"][layout.rank_list(r)]
        (step / layout.rank_list(r)).unlink()
    (step / layout.MARKER).write_text(json.dumps(marker))
    state = CheckpointStore(tmp_path, rank=1, world_size=world).load()
    fresh = torch.nn.Sequential(*(torch.nn.Linear(4, 4) for _ in range(3)))
    playranks.engine(1, world).load(state[SHARDED_KEY], fresh, files=state["marker_files"])
    assert all(torch.equal(a, b) for a, b in zip(fresh.state_dict().values(), model.state_dict().values()))
    shard = step / "__2_0.distcp"
    data = bytearray(shard.read_bytes())
    data[0] ^= 0x01
    shard.write_bytes(bytes(data))
    with pytest.raises(ShardCorrupt, match=r"__2_0\.distcp does not match"):
        playranks.engine(1, world).load(state[SHARDED_KEY], fresh, files=state["marker_files"])


def test_a_commit_drops_the_files_of_ranks_beyond_the_world_and_keeps_the_listed_ones(tmp_path):
    """A requeued job on fewer ranks saves into the .step-N.tmp a killed one left: the files of the
    ranks it no longer has go, those its ranks' lists name stay."""
    tmp = tmp_path / layout.name("tmp", 1)
    tmp.mkdir()
    for name in (layout.rank_list(7), layout.rank_state(7), "__7_0.distcp"):
        (tmp / name).write_bytes(b"left by a killed save")
    _save(tmp_path, 1, 2, playranks.model(3))
    names = sorted(p.name for p in (tmp_path / "step-1").iterdir())
    assert names == ["COMPLETE.json", "__0.metadata", "__0_0.distcp", "__1.metadata", "__1_0.distcp",
                     "files-0.json", "files-1.json", "rank-0.pt", "rank-1.pt", "shared.pt"], names
