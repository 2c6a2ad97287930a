"""Rank 0's commit of a save without DCP's collectives reads no rank's DCP index part, yet refuses
parts that leave the state short; loads read the parts, and checkpoints with a merged index too.

    python -m pytest -q tests/test_commit_claims.py

The ranks of a DDP job are played in one process (tests/playranks.py): each rank's DcpEngine is
told its place (rank r of W), saves its share of the replicated tensors into the checkpoint's
temporary directory and reports to rank 0 as the store does; then rank 0's store saves and commits.
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import playranks
import pytest
import torch
from playranks import no_slurm_job, recording  # noqa: F401  (an autouse fixture: the played ranks are no SLURM job's)

from hpc.checkpoint import SHARDED_KEY, StoreReader, layout
from hpc.checkpoint.dcp_engine import ShardCorrupt
from hpc.checkpoint.dcp_index import METADATA, merge_metadata, rank_metadata
from hpc.checkpoint.checksums import file_info


def _save(root: Path, world: int, model: torch.nn.Module, as_world: dict | None = None,
          models: dict | None = None) -> list[str]:
    """Ranks 1..world-1 save and report step 1, then rank 0 saves and commits it; the names of
    the files rank 0 opened meanwhile. `as_world`: ranks that think the world has another size;
    `models`: ranks that save another model."""
    return playranks.save_step(root, 1, world, model, as_world=as_world, models=models)


def _load(root: Path, rank: int = 0, world: int = 1) -> tuple[torch.nn.Module, list[str]]:
    """A fresh model loaded from the newest checkpoint as `rank`, and the files the load opened."""
    fresh = torch.nn.Sequential(*(torch.nn.Linear(4, 4) for _ in range(6)))
    state = StoreReader(root).load()
    with recording() as opened:
        playranks.engine(rank, world).load(state[SHARDED_KEY], fresh, files=state["marker_files"])
    return fresh, opened


def _same(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))


def test_rank_0_commits_without_reading_any_ranks_index_part(tmp_path):
    """The merge this replaces read every rank's part at the commit (O(ranks x tensors): 11 s of
    CPU at 512 ranks); the parts are committed as they are, listed in the marker."""
    model, world = playranks.model(), 8
    opened = _save(tmp_path, world, model)
    others = [n for n in opened if layout.rank_of(n) not in (None, 0) and not n.endswith(".done")]
    assert not others, others
    listed = layout.check(tmp_path / "step-1", crc=())[1]  # the marker's files, and its ranks' lists'
    assert {rank_metadata(r) for r in range(world)} <= set(listed) and METADATA not in listed
    fresh, read = _load(tmp_path, rank=5, world=world)  # DDP: every rank loads the whole state
    assert _same(fresh, model)
    assert read.count(rank_metadata(5)) == 1 and read.count(rank_metadata(0)) == 1


def test_a_commit_whose_ranks_split_the_state_differently_is_refused(tmp_path):
    """Rank 2 thinks the world has 3 ranks: the ranks' parts leave some tensors unwritten (and
    write others twice). The claims do not add up, and rank 0 names what is missing."""
    with pytest.raises(ValueError, match=r"values unwritten .*HINT: every rank must save the same model"):
        _save(tmp_path, 4, playranks.model(), as_world={2: 3})
    assert not (tmp_path / "step-1").exists()


def test_a_commit_whose_ranks_saved_different_models_is_refused(tmp_path):
    with pytest.raises(ValueError, match=r"rank 3 saved a different state from rank 0's .*HINT"):
        _save(tmp_path, 4, playranks.model(), models={3: playranks.model(7)})
    assert not (tmp_path / "step-1").exists()


def test_a_checkpoint_with_a_merged_index_still_loads(tmp_path):
    """What the commit wrote before the parts were kept: their merge as .metadata, listed in the
    marker with every rank's files (before the ranks' lists), the parts deleted. It loads from
    .metadata alone, as before."""
    model, step = playranks.model(), tmp_path / "step-1"
    _save(tmp_path, 2, model)
    merge_metadata(step, 2)
    marker = json.loads((step / layout.MARKER).read_text())
    marker["files"] = {n: info for n, info in layout.check(step, crc=())[1].items()
                       if n not in {layout.rank_list(0), layout.rank_list(1), rank_metadata(0), rank_metadata(1)}}
    for r in range(2):
        (step / rank_metadata(r)).unlink()
        (step / layout.rank_list(r)).unlink(missing_ok=True)
    marker["files"][METADATA] = file_info(step / METADATA)
    (step / layout.MARKER).write_text(json.dumps(marker))
    for rank in (0, 1):
        fresh, read = _load(tmp_path, rank, 2)
        assert _same(fresh, model) and read.count(METADATA) == 1
        assert not [n for n in read if n.endswith(METADATA) and n != METADATA]


def test_a_load_refuses_index_parts_that_do_not_cover_its_tensors(tmp_path):
    """The commit's check counts elements; a load checks that the chunks it reads cover each piece
    it loads, where DCP would leave the rest of the tensor as it was."""
    _save(tmp_path, 1, playranks.model())
    step = tmp_path / "step-1"
    part = pickle.loads((step / rank_metadata(0)).read_bytes())
    part.state_dict_metadata["model.0.weight"].chunks[0].sizes = torch.Size([2, 4])
    (step / rank_metadata(0)).write_bytes(pickle.dumps(part))
    marker = json.loads((step / layout.MARKER).read_text())
    marker["files"][rank_metadata(0)] = file_info(step / rank_metadata(0))
    (step / layout.MARKER).write_text(json.dumps(marker))
    with pytest.raises(ShardCorrupt, match=r"do not cover 1 tensors .*\(model\.0\.weight\)\. HINT"):
        _load(tmp_path)
