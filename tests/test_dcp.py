"""DcpEngine: sharded saves through DCP that load on another world size and strategy.

    python -m pytest -q tests/test_dcp.py

Real gloo groups on the CPU. The asynchronous save is taken after step 3 of 5, while training
goes on; a run of the other world size loads it, must hold exactly the state that was saved
(loading is a copy: bitwise), then trains the last two steps. Its final state must equal the
uninterrupted run's within test_fsdp's tolerance (float64, 1e-12: only the order of the gradient
sums differs between world sizes).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from hpc.checkpoint.dcp_engine import METADATA, DcpEngine
from test_fsdp import ATOL, load, max_difference, run_ranks

STEPS, SAVE_AT = 5, 3

# (strategy, world size) that saved -> (strategy, world size) that resumes; "solo": saved
# without DCP's collectives (each rank its part and index; a load merges the parts it needs)
CASES = {
    "ddp 2 -> 1": (("ddp", 2), ("ddp", 1)),
    "ddp 1 -> 2": (("ddp", 1), ("ddp", 2)),
    "fsdp 2 -> 1": (("fsdp", 2), ("fsdp", 1)),
    "fsdp 1 -> 2": (("fsdp", 1), ("fsdp", 2)),
    "ddp solo 2 -> fsdp 1": (("ddp solo", 2), ("fsdp", 1)),
    "fsdp solo 2 -> ddp 2": (("fsdp solo", 2), ("ddp", 2)),
}
SAVED = {("ddp", 2), ("fsdp", 2), ("ddp", 1), ("ddp solo", 2), ("fsdp solo", 2)}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """Uninterrupted runs that save at step 3; one process is the same under either strategy."""
    root = tmp_path_factory.mktemp("dcp")
    for strategy, world in SAVED:
        run_ranks(world, "train", saved_by(root, strategy, world), "--strategy", strategy.split()[0],
                  "--steps", STEPS, "--save-at", SAVE_AT, *(["--no-collectives"] if "solo" in strategy else []))
    return root


def saved_by(root, strategy, world):
    return root / (f"{strategy.replace(' ', '-')}{world}" if world > 1 else "ddp1")


@pytest.mark.parametrize("case", CASES)
def test_a_checkpoint_resumes_on_another_world_size(trained, tmp_path, case):
    (save_strategy, save_world), (strategy, world) = CASES[case]
    source = saved_by(trained, save_strategy, save_world)
    # saved without collectives: no merged index, each rank's part (the load merges what it needs)
    assert (source / "ckpt" / METADATA).is_file() != ("solo" in save_strategy)
    run_ranks(world, "resume", tmp_path, "--strategy", strategy, "--ckpt", source / "ckpt",
              "--start", SAVE_AT, "--steps", STEPS)
    assert max_difference(load(tmp_path / "loaded.pt"), load(source / "saved.pt")) == 0.0
    assert max_difference(load(tmp_path / "final.pt"), load(source / "final.pt")) <= ATOL


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_a_save_without_collectives_merges_into_the_index_dcp_writes(trained, strategy):
    """The same state saved with DCP's coordinator and without it: the ranks' parts merged list
    the same values, sizes and pieces as DCP's .metadata; each rank's index holds only what that
    rank wrote, and each non-tensor value is written once, by rank 0."""
    import pickle

    from hpc.checkpoint.dcp_index import merge, read_parts, rank_metadata

    def index(directory):
        if (directory / METADATA).exists():
            return pickle.loads((directory / METADATA).read_bytes())
        return merge(read_parts(directory, range(2)))

    def pieces(meta):
        return {fqn: sorted((tuple(c.offsets), tuple(c.sizes)) for c in m.chunks) if hasattr(m, "chunks")
                else "bytes" for fqn, m in meta.state_dict_metadata.items()}

    solo, plain = trained / f"{strategy}-solo2" / "ckpt", trained / f"{strategy}2" / "ckpt"
    assert pieces(index(solo)) == pieces(index(plain))
    assert index(solo).planner_data == index(plain).planner_data
    parts = [pickle.loads((solo / rank_metadata(r)).read_bytes()) for r in range(2)]
    for rank, part in enumerate(parts):
        assert {i.relative_path for i in part.storage_data.values()} == {f"__{rank}_0.distcp"}
    written = [set(p.state_dict_metadata) for p in parts]
    if strategy == "ddp":  # replicated: every value in exactly one rank's part
        assert written[0].isdisjoint(written[1]) and all(written)
    values = [{k for k, m in p.state_dict_metadata.items() if not hasattr(m, "chunks")} for p in parts]
    if strategy == "ddp":  # each once, all rank 0's: every rank opens every file at a load anyway
        assert values[0] and not values[1]
    else:  # each rank's own copy, and of the replicated tensors too: a load opens no other rank's file
        assert values[0] and values[0] == values[1]
        plain = {k for k, m in parts[0].state_dict_metadata.items() if hasattr(m, "chunks") and len(m.chunks) == 1
                 and tuple(m.chunks[0].sizes) == tuple(m.size)}
        assert plain and all(plain <= w for w in written)


def test_a_sharded_save_writes_one_file_per_rank(trained):
    files = sorted(p.name for p in (trained / "fsdp2" / "ckpt").glob("*.distcp"))
    assert files == ["__0_0.distcp", "__1_0.distcp"]


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_each_rank_stages_only_what_it_writes(trained, strategy):
    """An asynchronous save copies this rank's share: under DDP the ranks split the replicated
    tensors, under FSDP each copies its own shards and its copy of the few replicated tensors
    (AdamW's `step` scalars). At world 2 each rank copies about half of the state, the halves
    make the whole, and the resume tests above load every tensor."""
    reports = [json.loads((trained / f"{strategy}2" / f"rank-{r}.json").read_text()) for r in range(2)]
    sizes = reports[0]["state_bytes"]
    staged = [r["staged_bytes"] for r in reports]
    copies = reports[0]["plain_bytes"] if strategy == "fsdp" else 0  # every rank's but one
    assert 0 <= copies < sum(sizes) / 100
    assert sum(staged) == sum(sizes) + copies
    assert all(0 < b <= sum(sizes) / 2 + max(sizes) for b in staged), (staged, sizes)
    one = json.loads((trained / "ddp1" / "rank-0.json").read_text())
    assert one["staged_bytes"] == sum(one["state_bytes"])


def test_one_process_round_trip_and_async_save_copies_before_returning(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.ones(1, 3)).sum().backward()
    opt.step()
    expected = {k: v.clone() for k, v in model.state_dict().items()}
    with DcpEngine() as engine:
        engine.save(tmp_path / "a", model, opt)
        with torch.no_grad():  # changed while the thread writes: the save must not see it
            model.weight.add_(1.0)
        engine.wait()
        assert not engine.busy and (tmp_path / "a" / METADATA).is_file()
        fresh = torch.nn.Linear(3, 2)
        fresh_opt = torch.optim.AdamW(fresh.parameters(), lr=0.1)
        engine.load(tmp_path / "a", fresh, fresh_opt)
    assert max_difference(fresh.state_dict(), expected) == 0.0
    assert max_difference(fresh_opt.state_dict()["state"], opt.state_dict()["state"]) == 0.0


def test_a_failed_save_raises_and_the_engine_saves_again(tmp_path):
    (tmp_path / "file").write_text("not a directory")
    model = torch.nn.Linear(2, 2)
    with DcpEngine() as engine:
        with pytest.raises(NotADirectoryError):  # an Exception: DCP's own wrapper is not one
            engine.save(tmp_path / "file" / "ckpt", model)
            engine.wait()
        engine.save(tmp_path / "ckpt", model)
        engine.wait()
    assert (tmp_path / "ckpt" / METADATA).is_file()


def test_the_merge_refuses_parts_that_leave_a_hole(tmp_path):
    """A missing rank index, a value no rank wrote, a tensor not covered whole: each is an error
    naming the fix, and no .metadata is written (the commit fails; nothing loads half)."""
    import pickle

    from hpc.checkpoint.dcp_index import merge_metadata, rank_metadata

    model = torch.nn.Linear(3, 2)
    with DcpEngine() as engine:
        engine.save(tmp_path, model, blocking=True, collectives=False)
    assert not (tmp_path / METADATA).exists()
    with pytest.raises(ValueError, match=r"__1\.metadata is missing: rank 1 .*HINT"):
        merge_metadata(tmp_path, 2)
    own = tmp_path / rank_metadata(0)
    good = own.read_bytes()
    part = pickle.loads(good)
    del part.state_dict_metadata["model.bias"]
    own.write_bytes(pickle.dumps(part))
    with pytest.raises(ValueError, match=r"1 values unwritten and 0 tensors incomplete \(model\.bias\).*HINT"):
        merge_metadata(tmp_path, 1)
    part = pickle.loads(good)
    part.state_dict_metadata["model.weight"].chunks[0].sizes = torch.Size([1, 3])
    own.write_bytes(pickle.dumps(part))
    with pytest.raises(ValueError, match=r"0 values unwritten and 1 tensors incomplete \(model\.weight\)"):
        merge_metadata(tmp_path, 1)
    assert not (tmp_path / METADATA).exists()
    own.write_bytes(good)
    merge_metadata(tmp_path, 1)
    fresh = torch.nn.Linear(3, 2)
    with DcpEngine() as engine:
        engine.load(tmp_path, fresh)
    assert max_difference(fresh.state_dict(), model.state_dict()) == 0.0


def test_a_rank_that_cannot_write_its_part_fails_the_save_by_name_and_nobody_hangs(tmp_path):
    """Saves run without DCP's collectives: rank 1's failed write ends rank 1's save only. Rank 0
    hears of it through rank 1's report, names rank 1 and its error, and commits nothing; both
    ranks leave their loops with that error instead of waiting on each other."""
    from test_any_resume import launch

    launch(2, "fail", str(tmp_path), workload=Path(__file__).with_name("partfail_workload.py"))
    accounts = [json.loads((tmp_path / f"fail-{r}.json").read_text()) for r in range(2)]
    assert "no space left on device" in accounts[1]["error"].lower()
    assert "rank 1 could not write" in accounts[0]["error"] and "No space left on device" in accounts[0]["error"]
    assert not [n for n in accounts[0]["entries"] if n.startswith(("step-", ".step-"))], accounts[0]


def test_the_merge_builds_the_index_dcps_coordinator_builds_from_the_same_parts():
    """Parts of 4 ranks, each holding a shard of every tensor: hpc's merge of their own indexes
    and DCP's coordinator working from their plans and write results list the same chunks."""
    from bench.index_merge import measure

    assert measure(4)["same"]


def _resave_step_1(root, engine, model, collectives):
    """Step 1 of `model` through a CheckpointStore at `root` (1 rank, blocking), then loaded back:
    what the store committed, as a fresh model of the same shape holds it."""
    from hpc.checkpoint import SHARDED_KEY, CheckpointStore, StoreReader

    def shards(directory, blocking):
        engine.save(directory, model, blocking=blocking, collectives=collectives)
        return engine.wait

    store = CheckpointStore(root)
    try:
        store.save(1, {"step": 1}, blocking=True, sharded=shards)
    finally:
        store.close()
    fresh = torch.nn.Linear(model.in_features, model.out_features)
    engine.load(StoreReader(root).load()[SHARDED_KEY], fresh)
    return fresh


def test_a_stopped_attempt_left_in_the_temporary_directory_does_not_take_the_place_of_the_new_save(tmp_path):
    """A killed attempt at step 1, saved without collectives, left its index in .step-1.tmp; the
    next attempt saves step 1 again through DCP's coordinator. The commit must list and check the
    new save, not merge the old index over DCP's .metadata."""
    from hpc.checkpoint import layout

    old, new = torch.nn.Linear(5, 4), torch.nn.Linear(3, 2)
    with DcpEngine() as engine:
        engine.save(tmp_path / layout.name("tmp", 1), old, blocking=True, collectives=False)
        fresh = _resave_step_1(tmp_path, engine, new, collectives=True)
    assert max_difference(fresh.state_dict(), new.state_dict()) == 0.0


def test_a_save_after_an_elastic_restart_commits_none_of_the_missing_ranks_files(tmp_path):
    """A 4-rank attempt was killed while saving step 1; the requeued job, on 1 rank, saves step 1
    into the same .step-1.tmp. Ranks 1 to 3 are gone: their files must not be committed."""
    from hpc.checkpoint import layout

    tmp = tmp_path / layout.name("tmp", 1)
    tmp.mkdir()
    left = ["__1_0.distcp", "__3_0.distcp", "__2.metadata", "rank-1.pt", "rank-3.done"]
    kept = ["__0_0.distcp", "rank-0.pt", "__10notes.txt", "rank-x.pt"]  # this rank's, or no rank's
    for name in left + kept:
        (tmp / name).write_bytes(b"x" * 64)
    model = torch.nn.Linear(3, 2)
    with DcpEngine() as engine:
        fresh = _resave_step_1(tmp_path, engine, model, collectives=False)
    names = {p.name for p in (tmp_path / "step-1").iterdir()}
    assert not names & set(left)
    assert {"__0_0.distcp", "__10notes.txt", "rank-x.pt"} <= names
    assert max_difference(fresh.state_dict(), model.state_dict()) == 0.0


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_every_file_a_rank_writes_without_collectives_is_known_as_that_ranks(trained, strategy):
    """layout.rank_of reads back the names DCP gives a rank's files: a save by 2 real ranks
    holds nothing but their files and the merged index."""
    from hpc.checkpoint import layout

    names = [p.name for p in (trained / f"{strategy}-solo2" / "ckpt").iterdir()]
    owners = {n: layout.rank_of(n) for n in names if n != METADATA}
    assert sorted(set(owners.values())) == [0, 1], owners


@pytest.mark.parametrize("rank", [3, 12, 511])
def test_a_save_under_any_ranks_name_writes_only_files_of_that_rank(tmp_path, rank):
    """The same through DCP's own writer under a rank with more than one digit: a change in how
    DCP names a rank's files (or in hpc's pattern) fails here, not at an elastic restart."""
    import torch.distributed.checkpoint as dcp

    from hpc.checkpoint import layout, shardcrc
    from hpc.checkpoint.dcp_index import rank_metadata

    dcp.save({"w": torch.arange(6.0)}, storage_writer=shardcrc.writer(tmp_path, rank=rank), no_dist=True)
    names = {p.name for p in tmp_path.iterdir()}
    assert rank_metadata(rank) in names
    assert {layout.rank_of(n) for n in names} == {rank}, names


def _steps_taken(optimizer):
    """A list that grows by one at each step of `optimizer`."""
    taken = []
    optimizer.register_step_pre_hook(lambda *_: taken.append(1))
    return taken


def _model_and_optimizer(optimizer_class):
    """The same small model (seeded) and a new optimizer of that class over it."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Linear(5, 2))
    return model, optimizer_class(model.parameters(), lr=0.1)


@pytest.mark.parametrize("watched", [True, False], ids=["watched", "unwatched"])
def test_an_optimizer_that_keeps_no_state_is_saved_and_loaded_without_a_step(tmp_path, watched):
    """SGD without momentum keeps no state: once it has been seen stepping, a save takes its
    (empty) state as it is, instead of DCP's filling it in with a zero-gradient step over the
    whole model, and a load of a checkpoint without optimizer state does the same. Unwatched, the
    save is DCP's own, step included: what the watched case is measured against."""
    from hpc.checkpoint import optim_state

    model, opt = _model_and_optimizer(torch.optim.SGD)
    if watched:
        optim_state.watch(opt)
    for _ in range(2):
        model(torch.randn(3, 6)).sum().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    taken = _steps_taken(opt)
    with DcpEngine() as engine:
        engine.save(tmp_path, model, opt, blocking=True)
        assert len(taken) == (0 if watched else 1)
        assert all(p.grad is None for p in model.parameters())
        fresh_model, fresh_opt = _model_and_optimizer(torch.optim.SGD)
        loaded = _steps_taken(fresh_opt)
        engine.load(tmp_path, fresh_model, fresh_opt)
    assert loaded == [] and not fresh_opt.state
    assert max_difference(fresh_model.state_dict(), model.state_dict()) == 0.0
    assert all(p.grad is None for p in fresh_model.parameters())


def test_an_optimizer_that_keeps_state_saves_it_and_loads_it_back(tmp_path):
    """Adam stepped with gradients: its state is saved and loaded exactly. Adam stepped without
    any (its state still empty) is saved as it is, and a fresh Adam loads that checkpoint without
    being asked for state it does not hold."""
    from hpc.checkpoint import optim_state

    model, opt = _model_and_optimizer(torch.optim.Adam)
    optim_state.watch(opt)
    model(torch.randn(3, 6)).sum().backward()
    opt.step()
    with DcpEngine() as engine:
        engine.save(tmp_path / "stateful", model, opt, blocking=True)
        fresh_model, fresh_opt = _model_and_optimizer(torch.optim.Adam)
        engine.load(tmp_path / "stateful", fresh_model, fresh_opt)
        saved, loaded = opt.state_dict()["state"], fresh_opt.state_dict()["state"]
        assert saved.keys() == loaded.keys() and saved
        for k in saved:
            assert max_difference(saved[k], loaded[k]) == 0.0

        idle_model, idle = _model_and_optimizer(torch.optim.Adam)
        optim_state.watch(idle)
        idle.step()  # no gradients: Adam makes no state
        engine.save(tmp_path / "empty", idle_model, idle, blocking=True)
        fresh_model, fresh_opt = _model_and_optimizer(torch.optim.Adam)
        engine.load(tmp_path / "empty", fresh_model, fresh_opt)
    assert not idle.state and not fresh_opt.state
