"""FSDP2 through s.wrap(strategy="fsdp"): real 2-rank gloo groups on the CPU, against one process.

    python -m pytest -q tests/test_fsdp.py

Tolerance: the runs use float64. Two ranks average two half-batch gradients where one process
takes the mean over the whole batch, so sums are rounded in another order: a few ulp per step,
which five AdamW steps cannot grow past 1e-12 (AdamW divides by sqrt(v) + eps, and v is far from
zero here). Any real difference (a missed reduction, a wrong shard) is of the order of the
learning rate, 1e-2.
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
from hpc.runtime.fsdp import default_units, shard
from fsdp_workload import Net
import ranklaunch
from test_ddp_session import free_port

WORKLOAD = Path(__file__).with_name("fsdp_workload.py")
REPO = Path(__file__).resolve().parents[1]
ATOL = 1e-12


def run_ranks(world: int, *args: str, timeout: float = 120) -> None:
    """Run fsdp_workload.py as `world` torchrun-style processes of the checkout under test."""
    port = str(free_port())
    procs = []
    for rank in range(world):
        env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1",
               "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world),
               "LOCAL_WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}
        procs.append(ranklaunch.popen([sys.executable, str(WORKLOAD), *map(str, args)], env=env,
                                      stderr=subprocess.PIPE, text=True))
    codes = [p.wait(timeout=timeout) for p in procs]
    errors = [p.stderr.read() for p in procs]
    assert codes == [0] * world, "\n".join(errors)


def max_difference(a, b) -> float:
    """Largest absolute difference between two nested states; structure and non-tensors equal."""
    if isinstance(a, dict):
        assert a.keys() == b.keys()
        return max((max_difference(a[k], b[k]) for k in a), default=0.0)
    if isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        return max((max_difference(x, y) for x, y in zip(a, b)), default=0.0)
    if torch.is_tensor(a):
        assert a.shape == b.shape and a.dtype == b.dtype
        return (a.double() - b.double()).abs().max().item() if a.numel() else 0.0
    assert a == b
    return 0.0


def load(path: Path) -> dict:
    return torch.load(path, weights_only=True)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Five steps with two micro-batches each: FSDP on 2 ranks, and one plain process."""
    root = tmp_path_factory.mktemp("fsdp")
    run_ranks(2, "train", root / "fsdp2", "--strategy", "fsdp", "--accum", "2")
    run_ranks(1, "train", root / "one", "--accum", "2")
    return root


def test_two_ranks_train_as_one_process(runs):
    sharded, single = load(runs / "fsdp2" / "final.pt"), load(runs / "one" / "final.pt")
    assert max_difference(sharded, single) <= ATOL
    torch.manual_seed(0)  # as the workload builds its model: training did move the parameters
    assert max_difference(Net().double().state_dict(), single["model"]) > 1e-3


def test_each_rank_holds_about_half_of_the_parameters(runs):
    reports = [json.loads((runs / "fsdp2" / f"rank-{r}.json").read_text()) for r in range(2)]
    total = reports[0]["numel"]
    assert sum(r["local_numel"] for r in reports) >= total
    assert all(r["local_numel"] < total * 0.6 for r in reports)


def test_no_sync_if_defers_the_reduce_scatter_while_accumulating(runs):
    reports = [json.loads((runs / "fsdp2" / f"rank-{r}.json").read_text()) for r in range(2)]
    assert not any(r["grads_before_last_micro_batch"] for r in reports)


def test_one_task_gets_the_plain_model_under_fsdp():
    with hpc.ddp.session(env=from_environ({})) as s:
        model = torch.nn.Linear(2, 2)
        assert s.wrap(model, strategy="fsdp") is model


def test_unknown_strategy_is_refused_with_a_hint():
    with hpc.ddp.session(env=from_environ({})) as s:
        with pytest.raises(ValueError, match=r"unknown strategy 'zero3'.*HINT"):
            s.wrap(torch.nn.Linear(2, 2), strategy="zero3")


class Blocks(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = torch.nn.Linear(2, 2)
        self.layers = torch.nn.ModuleList(
            torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ModuleList([torch.nn.ReLU()]))
            for _ in range(3))


def test_default_units_are_the_outermost_module_list_elements():
    model = Blocks()
    assert default_units(model) == list(model.layers)
    assert default_units(torch.nn.Linear(2, 2)) == []


def test_the_model_itself_is_not_a_unit():
    model = Blocks()
    with pytest.raises(ValueError, match="HINT"):
        shard(model, mesh=None, units=[model])
