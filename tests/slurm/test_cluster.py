"""The local cluster behaves like a real multi-node SLURM: ranks, GPUs, accounting, preemption."""

from __future__ import annotations

import contextlib
import errno
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpc.cluster import ClusterError, LocalCluster
from hpc.cluster.layout import default_port_base
from hpc.cluster.portclaims import free_port_block
from hpc.cluster.preempt import job_field, preempt

pytestmark = pytest.mark.slurm


def sbatch(cluster: LocalCluster, *args: str) -> str:
    return cluster.run(["sbatch", "--parsable", *args]).stdout.strip().split(";")[0]


def wait_state(cluster: LocalCluster, job_id: str, states: set[str], timeout_s: float = 60) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        state = job_field(cluster, job_id, "JobState")
        if state in states:
            return state
        time.sleep(0.3)
    raise AssertionError(f"job {job_id} is {state}, never reached {states}")


def sacct_state(cluster: LocalCluster, job_id: str, timeout_s: float = 30) -> str:
    """The job's final state in the accounting database (written shortly after it ends)."""
    deadline = time.monotonic() + timeout_s
    state = ""
    while time.monotonic() < deadline:
        out = cluster.run(["sacct", "-n", "-X", "-P", "-j", job_id, "-o", "State"], check=False).stdout.split()
        state = out[0] if out else ""
        if state and state not in {"PENDING", "RUNNING", "REQUEUED"}:
            return state
        time.sleep(0.5)
    return state


def test_two_nodes_two_tasks_see_their_ranks_and_gpus(slurm_cluster, job_dir):
    out = job_dir / "ranks.txt"
    jid = sbatch(slurm_cluster, "--nodes=2", "--ntasks-per-node=2", "--gres=gpu:2", f"--output={out}",
                 "--wrap", "srun bash -c 'echo $SLURM_PROCID $SLURM_LOCALID $SLURM_NODEID $SLURMD_NODENAME "
                           "$SLURM_NTASKS $CUDA_VISIBLE_DEVICES'")
    assert wait_state(slurm_cluster, jid, {"COMPLETED", "FAILED", "CANCELLED"}) == "COMPLETED"
    rows = sorted(tuple(line.split()) for line in out.read_text().splitlines())
    assert rows == [("0", "0", "0", "n1", "4", "0,1"), ("1", "1", "0", "n1", "4", "0,1"),
                    ("2", "0", "1", "n2", "4", "0,1"), ("3", "1", "1", "n2", "4", "0,1")]
    assert sacct_state(slurm_cluster, jid) == "COMPLETED"


def test_preempted_low_job_is_requeued_and_sees_restart_count(slurm_cluster, job_dir):
    out = job_dir / "restarts.txt"
    jid = sbatch(slurm_cluster, "--partition=low", "--requeue", "--nodes=1", f"--output={out}",
                 "--open-mode=append", "--wrap", "echo restart=${SLURM_RESTART_COUNT:-0}; sleep 300")
    wait_state(slurm_cluster, jid, {"RUNNING"})
    deadline = time.monotonic() + 10
    while "restart=0" not in (out.read_text() if out.exists() else "") and time.monotonic() < deadline:
        time.sleep(0.2)
    preempt(slurm_cluster, jid)
    wait_state(slurm_cluster, jid, {"RUNNING"})
    deadline = time.monotonic() + 20
    while "restart=1" not in out.read_text() and time.monotonic() < deadline:
        time.sleep(0.2)
    slurm_cluster.run(["scancel", jid])
    lines = out.read_text().splitlines()
    assert [ln for ln in lines if ln.startswith("restart=")] == ["restart=0", "restart=1"]
    assert any("PREEMPTION" in ln for ln in lines)  # SLURM's own word for why the first run ended


def test_preempting_a_job_that_is_not_running_says_so(slurm_cluster):
    jid = sbatch(slurm_cluster, "--hold", "--wrap", "true")
    try:
        with pytest.raises(ClusterError, match="expected RUNNING"):
            preempt(slurm_cluster, jid)
    finally:
        slurm_cluster.run(["scancel", jid])


def test_a_submission_trusts_the_controller_over_an_accounting_record_that_lags(slurm_cluster, job_dir):
    """slurmdbd hears of a job's end after slurmctld: a record still RUNNING in sacct's answer is
    replaced by the controller's FAILED, and a job the controller has never heard of keeps its record."""
    from hpc.slurm import scheduler

    jid = sbatch(slurm_cluster, f"--output={job_dir}/out", "--wrap", "exit 3")
    wait_state(slurm_cluster, jid, {"FAILED"})
    lagging = scheduler.JobRecord(jid, "RUNNING", "RUNNING", "None", "", "", "", "", "n1", 0)
    unknown = scheduler.JobRecord("99999", "PENDING", "PENDING", "None", "", "", "", "", "", 0)
    answer = scheduler.confirm_active(scheduler.Answer({jid: lagging, "99999": unknown}, "sacct"))
    assert (answer[jid].state, answer["99999"]) == ("FAILED", unknown)
    assert answer.source == "sacct"


def _hold(port: int) -> socket.socket:
    held = socket.socket()
    held.bind(("127.0.0.1", port))
    held.listen()
    return held


@contextlib.contextmanager
def _in_use(port: int):
    """`port` in use inside the block: held here, or already held by another (a parallel worker's cluster)."""
    try:
        held = _hold(port)
    except OSError as err:
        if err.errno != errno.EADDRINUSE:
            raise
        held = contextlib.nullcontext()
    with held:
        yield


def test_a_named_port_block_in_use_is_refused_with_the_fix(tmp_path):
    base = free_port_block(default_port_base(str(tmp_path)))
    with _hold(base + 1):
        with pytest.raises(ClusterError, match=rf"ports \[{base + 1}\] are in use.*HINT: .*--port-base"):
            LocalCluster(tmp_path, nodes=1, gpus_per_node=0, port_base=base).up(log=lambda m: None)


def test_second_cluster_does_not_collide_and_down_leaves_nothing(slurm_cluster, tmp_path):
    # its directory's default block is in use (held here, or by another worker's cluster): it
    # takes the next free block, says so, and keeps it
    default = default_port_base(str(tmp_path / "second"))
    other = LocalCluster(tmp_path / "second", nodes=1, gpus_per_node=0, cpus_per_node=2)
    said = []
    with _in_use(default):
        other.up(log=said.append)
    assert other.layout.port_base != default and any("in use: this cluster takes ports" in m for m in said), said
    assert not set(other.layout.all_ports()) & set(slurm_cluster.layout.all_ports())
    assert LocalCluster(tmp_path / "second").layout.port_base == other.layout.port_base
    try:
        other.up(log=lambda m: None)  # idempotent
        pids = [d.pid() for d in other._daemons()]
        assert all(pids)
        pidfile = tmp_path / "job.pids"
        jid = sbatch(other, "--output=/dev/null", "--wrap", f"echo $$ > {pidfile}; sleep 300 & echo $! >> {pidfile}; wait")
        wait_state(other, jid, {"RUNNING"})
        deadline = time.monotonic() + 10
        while len(pidfile.read_text().split() if pidfile.exists() else []) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        pids += [int(p) for p in pidfile.read_text().split()]
        assert len(pids) == len(other._daemons()) + 2
    finally:
        other.down(log=lambda m: None)
    assert not [p for p in pids if Path(f"/proc/{p}").exists() and _not_zombie(p)]
    conf = str(other.conf)
    leftovers = subprocess.run(["pgrep", "-f", str(other.dir)], capture_output=True, text=True).stdout.split()
    assert leftovers == [], f"processes still running for {conf}: {leftovers}"
    # The session cluster is untouched.
    assert "idle" in slurm_cluster.run(["sinfo", "-h", "-o", "%t"]).stdout


def _colliding_dirs(root: Path) -> tuple[Path, Path]:
    """Two directories whose default port blocks are the same."""
    seen: dict[int, Path] = {}
    for i in range(10 * 1000):
        d = root / f"c{i}"
        seen.setdefault(default_port_base(str(d)), d)
        if seen[default_port_base(str(d))] != d:
            return seen[default_port_base(str(d))], d
    raise AssertionError("no two directories share a default block")


def test_two_ups_at_once_on_the_same_block_both_come_up(tmp_path):
    """Started at the same moment, neither finds the block's ports bound yet: the claim makes the
    second move (without it, its slurmctld found its port taken and exited)."""
    dirs = _colliding_dirs(tmp_path)
    ups = [subprocess.Popen([sys.executable, "-m", "hpc.cluster", "up", "--dir", str(d), "--nodes", "1",
                             "--no-accounting"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
           for d in dirs]
    try:
        said = [u.communicate(timeout=180)[0] for u in ups]
        assert [u.returncode for u in ups] == [0, 0], said
        blocks = [LocalCluster(d).layout.port_base for d in dirs]
        assert blocks[0] != blocks[1], said
        assert sum("claimed by another `hpc.cluster up` starting now" in out for out in said) <= 1, said
        for d in dirs:
            assert "idle" in LocalCluster(d).run(["sinfo", "-h", "-o", "%t"]).stdout
    finally:
        for u in ups:
            u.kill() if u.poll() is None else None
        for d in dirs:
            LocalCluster(d).down(log=lambda m: None)


def _not_zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_settle_brings_back_a_node_left_drained_with_a_job_on_it(slurm_cluster):
    """What a test can leave behind: a node drained under its job. The job is cancelled, the node
    stays drained; settle() sets the nodes still held down and back (the step that also clears a
    job stuck completing), and every node is idle again."""
    slurm_cluster.run(["sbatch", "--partition=low", "--nodelist=n1", "--output=/dev/null",
                       "--wrap=sleep 300"])
    deadline = time.monotonic() + 60
    while not {"alloc", "mix"} & set(slurm_cluster.run(["sinfo", "-h", "-N", "-n", "n1", "-o", "%t"]).stdout.split()):
        assert time.monotonic() < deadline, "the job never started on n1"
        time.sleep(0.3)
    slurm_cluster.run(["scontrol", "update", "NodeName=n1", "State=DRAIN", "Reason=left-by-a-test"])
    slurm_cluster.settle(timeout_s=20)
    states = slurm_cluster.run(["sinfo", "-h", "-N", "-o", "%N %t"]).stdout.split()
    assert dict(zip(states[::2], states[1::2])) == {n: "idle" for n in slurm_cluster.nodes}
