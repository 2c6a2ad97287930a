"""A model built on the meta device: s.wrap shards it, then gives each rank storage for its shards only.

    python -m pytest -q tests/test_fsdp_meta.py

Two gloo ranks wrap a 64 MiB model of 16 residual Linear(1023) blocks built under
torch.device("meta") (tests/meta_workload.py); gathered, it must equal the plain build of the seed. The resident memory each rank gains while wrapping
and initialising must stay within its half of the model, plus the largest sharding unit, plus
OVERHEAD (allocator slack and FSDP's bookkeeping; the code FSDP loads on first use is warmed up
before): materialising the whole model on a rank first, as wrap did before, would exceed it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import hpc.ddp
from hpc.runtime.envparse import from_environ
from meta_workload import Deep
import ranklaunch
from test_ddp_session import free_port
from test_fsdp import REPO

WORKLOAD = Path(__file__).with_name("meta_workload.py")
OVERHEAD = 20 * 2**20  # 16 MiB was once exceeded by 0.2 MiB at load 10; the whole model, 64 MiB, stays above
BLOCKS, WIDTH = 16, 1023


def test_a_meta_model_sharded_over_two_ranks_is_the_plain_build_of_the_same_seed(two_ranks):
    """Each rank keeps its part of the full init, so the gathered model is bit for bit the one
    `torch.manual_seed(0); Deep(...)` builds in one process, distinct shards included."""
    out, _ = two_ranks
    initial = torch.load(out / "initial.pt")
    torch.manual_seed(0)
    plain = Deep(BLOCKS, WIDTH).state_dict()
    assert initial.keys() == plain.keys()
    for key, value in plain.items():
        assert torch.equal(initial[key], value), f"{key} differs from the plain build"


def run_meta(world: int, out: Path, *args: str) -> list[dict]:
    port = str(free_port())
    procs = []
    for rank in range(world):
        env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": f"{REPO}:{REPO / 'tests'}", "OMP_NUM_THREADS": "1",
               "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world),
               "LOCAL_WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}
        procs.append(ranklaunch.popen([sys.executable, str(WORKLOAD), str(out), *args], env=env,
                                      stderr=subprocess.PIPE, text=True))
    errors = [p.communicate(timeout=300)[1] for p in procs]
    assert [p.returncode for p in procs] == [0] * world, "\n".join(errors)
    return [json.loads((out / f"rank-{r}.json").read_text()) for r in range(world)]


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory) -> tuple[Path, list[dict]]:
    """One 2-rank run for the tests below (odd width: the shards of every tensor differ in size)."""
    out = tmp_path_factory.mktemp("meta")
    return out, run_meta(2, out, "--strategy", "fsdp", "--blocks", str(BLOCKS), "--width", str(WIDTH))


def test_a_meta_model_is_sharded_initialised_and_trained_without_the_full_model_on_a_rank(two_ranks):
    _, reports = two_ranks
    for r in reports:
        assert r["in_bounds"], "shards were not initialised by reset_parameters"
        assert r["local_numel"] < r["numel"] * 0.6
        assert r["losses"][-1] < r["losses"][0]
        share = r["model_bytes"] / r["world"]
        assert r["grown"] <= share + r["unit_bytes"] + OVERHEAD, \
            f"{r['grown']:,} bytes gained while wrapping; the rank's share is {share:,.0f}"


def test_one_task_materialises_a_meta_model_with_reset_parameters():
    with hpc.ddp.session(env=from_environ({})) as s:
        with torch.device("meta"):
            model = Deep(2, 16)
        model = s.wrap(model, strategy="fsdp")
        weights = [p for p in model.parameters()]
        assert not any(p.is_meta for p in weights)
        assert all(bool((p.abs() <= 0.25).all()) for p in weights)  # 1/sqrt(16)
        assert model(torch.ones(1, 16)).isfinite().all()


def test_init_fn_replaces_reset_parameters():
    with hpc.ddp.session(env=from_environ({})) as s:
        with torch.device("meta"):
            model = Deep(2, 4)
        model = s.wrap(model, init_fn=lambda m: [torch.nn.init.constant_(p, 0.5) for p in m.parameters()])
        assert all(bool((p == 0.5).all()) for p in model.parameters())


class NoReset(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.empty(3))


def test_a_module_without_reset_parameters_is_named_with_a_hint():
    with hpc.ddp.session(env=from_environ({})) as s:
        with torch.device("meta"):
            model = NoReset()
        with pytest.raises(ValueError, match=r"without reset_parameters\(\): the model \(NoReset\).*HINT.*init_fn"):
            s.wrap(model, strategy="fsdp")
