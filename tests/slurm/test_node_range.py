"""A stage asking for a node range (sbatch --nodes=1-2) starts on what is free and says what it got.

    python -m pytest tests/slurm/test_node_range.py -m slurm

One of the sandbox's two nodes is drained for the test (and resumed after it, whatever happens):
the job must not wait for it, and its world is the one node's ranks.
"""
import json

import pytest

from hpc import submit
from hpc.rundir.run import DONE, RunDir
from tests.slurm.test_pipeline import ended, job_ids, tiny, wait_until  # noqa: F401 (fixture)

pytestmark = pytest.mark.slurm


def node_state(cluster, node):
    out = cluster.run(["scontrol", "show", "node", node]).stdout
    return next(w.split("=", 1)[1] for w in out.split() if w.startswith("State="))


@pytest.fixture
def one_node_drained(slurm_cluster):
    node = slurm_cluster.nodes[-1]
    slurm_cluster.run(["scontrol", "update", f"nodename={node}", "state=drain", "reason=hpc-node-range-test"])
    try:
        wait_until(lambda: "DRAIN" in node_state(slurm_cluster, node), 60, f"{node} drained")
        yield node
    finally:  # the next test must find both nodes in service
        slurm_cluster.run(["scontrol", "update", f"nodename={node}", "state=resume"], check=False)
        wait_until(lambda: "DRAIN" not in node_state(slurm_cluster, node), 60, f"{node} back in service")


def run_range(run_dir):
    """Stage `second` (one task) asks for 1-2 nodes of 2 ranks each; its done marker and log."""
    assert submit.main(["tiny", "--cluster", "slurm", "--run-dir", str(run_dir), "tiny.parts=[0]",
                        "stages.second.nodes=1-2", "stages.second.tasks_per_node=2"]) == 0
    run = RunDir(run_dir)
    records = wait_until(lambda: ended(run), what="both stages to end")
    second = records[job_ids(run)[("second", 0)]]
    assert second.state == "COMPLETED", second
    done = json.loads((run.task_dir("second", 0) / DONE).read_text())
    log = "".join(p.read_text() for p in (run.path / "second" / "logs").rglob("*_log.out"))
    return second, done, log


def test_a_node_range_starts_on_the_one_node_left_and_says_its_world(slurm_cluster, one_node_drained, tmp_path):
    second, done, log = run_range(tmp_path / "run")
    assert second.nodes and one_node_drained not in second.nodes, second
    assert (done["world_size"], done["nodes"]) == (2, 1)
    assert "rank 0/2 on 1 node(s)" in log and "rank 1/2 on 1 node(s)" in log, log


def test_a_node_range_takes_both_nodes_when_both_are_free(slurm_cluster, tmp_path):
    _, done, log = run_range(tmp_path / "run")
    assert (done["world_size"], done["nodes"]) == (4, 2)
    assert all(f"rank {r}/4 on 2 node(s)" in log for r in range(4)), log
