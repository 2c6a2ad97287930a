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

import pytest
import torch

from hpc.checkpoint.dcp_engine import METADATA, DcpEngine
from test_fsdp import ATOL, load, max_difference, run_ranks

STEPS, SAVE_AT = 5, 3

# (strategy, world size) that saved -> (strategy, world size) that resumes
CASES = {
    "ddp 2 -> 1": (("ddp", 2), ("ddp", 1)),
    "ddp 1 -> 2": (("ddp", 1), ("ddp", 2)),
    "fsdp 2 -> 1": (("fsdp", 2), ("fsdp", 1)),
    "fsdp 1 -> 2": (("fsdp", 1), ("fsdp", 2)),
}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """Uninterrupted runs that save at step 3; one process is the same under either strategy."""
    root = tmp_path_factory.mktemp("dcp")
    for strategy, world in {("ddp", 2), ("fsdp", 2), ("ddp", 1)}:
        run_ranks(world, "train", root / f"{strategy}{world}", "--strategy", strategy,
                  "--steps", STEPS, "--save-at", SAVE_AT)
    return root


def saved_by(root, strategy, world):
    return root / (f"{strategy}{world}" if world > 1 else "ddp1")


@pytest.mark.parametrize("case", CASES)
def test_a_checkpoint_resumes_on_another_world_size(trained, tmp_path, case):
    (save_strategy, save_world), (strategy, world) = CASES[case]
    source = saved_by(trained, save_strategy, save_world)
    assert (source / "ckpt" / METADATA).is_file()
    run_ranks(world, "resume", tmp_path, "--strategy", strategy, "--ckpt", source / "ckpt",
              "--start", SAVE_AT, "--steps", STEPS)
    assert max_difference(load(tmp_path / "loaded.pt"), load(source / "saved.pt")) == 0.0
    assert max_difference(load(tmp_path / "final.pt"), load(source / "final.pt")) <= ATOL


def test_a_sharded_save_writes_one_file_per_rank(trained):
    files = sorted(p.name for p in (trained / "fsdp2" / "ckpt").glob("*.distcp"))
    assert files == ["__0_0.distcp", "__1_0.distcp"]


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_each_rank_stages_only_what_it_writes(trained, strategy):
    """An asynchronous save copies this rank's share: under DDP the ranks split the replicated
    tensors, under FSDP each copies its own shards. At world 2 each rank copies about half of the
    state, the halves make the whole, and the resume tests above load every tensor."""
    reports = [json.loads((trained / f"{strategy}2" / f"rank-{r}.json").read_text()) for r in range(2)]
    sizes = reports[0]["state_bytes"]
    staged = [r["staged_bytes"] for r in reports]
    assert sum(staged) == sum(sizes)
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
