"""Restarts in place on the real local cluster: a rank killed or hung mid-training, and a failed node with
and without a spare, each restarted by the srun wrapper as a new srun step of the same job, from its
checkpoint; a restart that fails the same way falls back to a requeue.

    python -m pytest tests/slurm/test_restart_in_place.py -m slurm -n 0 -p no:cacheprovider

The workload (tests/inplace_pipeline.py over tests/elastic_workload.py) trains a float64 model under
DDP, checkpointing every step. Compared with one uninterrupted run of the same world size: the
samples and loss of every step, and the final model and optimizer state, bitwise (a restart resumes
on the ranks it had). A node range that loses a node shrinks instead, as an elastic resume does:
there only the order of the ranks' gradient sums changes, and the comparison is within
tests/slurm/test_elastic_cluster.py's ATOL. Each completes as ONE job: sacct shows it COMPLETED with
no requeue (Restarts=0), except the fallback, which shows one.
"""
import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from faults.nodes import bring_back, job_processes
from hpc import submit
from hpc.cluster.preempt import job_field
from hpc.monitor import timeline
from hpc.pipeline import plan
from hpc.recovery import nodefail
from hpc.recovery.hangs import HANGS, REPORT
from hpc.rundir.run import DONE, RunDir
from hpc.slurm import hostlist
from tests.box import boxed
from tests.slurm.pipelines import use_pipelines
from tests.slurm.requeue_helpers import release, steps_of, submit_run
from tests.slurm.test_nodecheck import fails_on
from tests.slurm.test_pipeline import ended, job_ids, wait_until

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
from test_fsdp import ATOL, load, max_difference  # noqa: E402

pytestmark = pytest.mark.slurm
STEPS = 8


inplace = use_pipelines(inplace="tests.inplace_pipeline")


def train(run_dir: Path, *overrides: str) -> RunDir:
    assert submit.main(["inplace", "--cluster", "slurm", "--run-dir", str(run_dir), f"inplace.steps={STEPS}",
                        "stages.train.nodes=1", *overrides]) == 0
    return RunDir(run_dir)


@pytest.fixture(scope="module")
def reference(slurm_cluster, tmp_path_factory):
    """One uninterrupted 1 x 2 run (every run here asks for 1 node x 2 tasks, unless told otherwise)."""
    os.chdir(ROOT)
    plan.PIPELINES["inplace"] = "tests.inplace_pipeline"
    run = train(tmp_path_factory.mktemp("reference") / "run")
    finished(run)
    return run.task_dir("train")


def finished(run: RunDir, restarts: int = 0):
    """The one job's sacct record once it ended COMPLETED after `restarts` requeues."""
    (job,) = job_ids(run).values()
    records = wait_until(lambda: (r := ended(run)) and r[job].restarts == restarts and r, 240, "the job's end")
    assert records[job].state == "COMPLETED", records[job]
    assert (run.task_dir("train") / DONE).is_file()
    return records[job]


def attempts(out: Path) -> list:
    return [json.loads(line) for line in (out / "attempts.jsonl").read_text().splitlines()]


def per_step(out: Path) -> tuple:
    """{step: sample ids} and {step: loss}, each step from the last attempt that ran it."""
    ids, losses = {}, {}
    for attempt in attempts(out):
        tag = attempt["tag"]
        for log in out.glob(f"ids-{tag}*.jsonl"):
            for entry in map(json.loads, log.read_text().splitlines()):
                ids.setdefault(tag, {}).setdefault(entry["step"], []).extend(entry["ids"])
        lines = (out / f"loss{tag}.jsonl").read_text().splitlines()
        losses.update({e["step"]: e["loss"] for e in map(json.loads, lines)})
    merged = {}
    for attempt in attempts(out):
        merged.update({step: sorted(v) for step, v in ids.get(attempt["tag"], {}).items()})
    return dict(sorted(merged.items())), dict(sorted(losses.items()))


def same_training(out: Path, ref: Path, atol: float = 0.0) -> None:
    """Every step's samples as the reference's; losses and the final state equal (bitwise at atol 0)."""
    ids, loss = per_step(out)
    ref_ids, ref_loss = per_step(ref)
    assert ids == ref_ids and list(ids) == list(range(1, STEPS + 1))
    assert max(abs(loss[step] - ref_loss[step]) for step in ids) <= atol, (loss, ref_loss)
    assert max_difference(load(out / "final.pt"), load(ref / "final.pt")) <= atol


def history(out: Path) -> dict:
    return json.loads((out / nodefail.HISTORY).read_text())


def status_text(run: RunDir) -> str:
    return subprocess.run([sys.executable, "-m", "hpc.status", str(run.path)], capture_output=True, text=True,
                          check=True).stdout


def restarts_in_place(out: Path) -> list:
    return [e for e in history(out)["events"] if e["kind"] == "restart_in_place"]


def test_a_killed_rank_restarts_in_place_from_its_checkpoint(reference, tmp_path):
    run = train(tmp_path / "run", "inplace.fault=kill", "inplace.fault_at=4")
    out = run.task_dir("train")
    finished(run)
    first, second = attempts(out)
    assert (first["resumed_from"], first["world_size"], second["world_size"]) == (0, 2, 2)
    assert 1 <= second["resumed_from"] <= 3, second  # the newest complete checkpoint before the kill
    assert first["tag"].split("-")[:2] == second["tag"].split("-")[:2]  # the same job, the same SLURM attempt
    (event,) = restarts_in_place(out)
    # "error" where its peer's collective error reached the step's folder before srun ended that rank
    assert event["failure"] in ("crash", "error") and (event["in_place"], event["progress"]) == (
        1, second["resumed_from"]), event
    same_training(out, reference)
    text = status_text(run)
    assert "1 restart(s) in place" in text and "a rank crashed" in text, text
    (row,) = timeline.collect(str(run.path))  # one sacct attempt, the restart marked on it
    assert [s.kind for s in row.lanes[0].segments if s.gid or s.kind == "RESTARTED"] == ["COMPLETED", "RESTARTED"]


def hang_reports(out: Path) -> list:
    return [json.loads(p.read_text()) for p in (out / HANGS).glob(f"*/{REPORT}")]


def test_a_rank_hung_in_a_collective_restarts_in_place(reference, tmp_path):
    """Its ranks run with no SLURM client in reach, as in a container (tests/box.py): the host does it all."""
    run = train(tmp_path / "run", "inplace.fault=hang", "inplace.fault_at=4", *boxed())
    out = run.task_dir("train")
    finished(run)
    (report,) = hang_reports(out)
    assert report["stuck"] == [1] and report["decision"]["by"] == "in place", report
    (event,) = restarts_in_place(out)
    assert event["failure"] == "hang" and event["step"] == 3, event
    stops = json.loads((out / "checkpoints" / "requeue.json").read_text())
    assert stops["hangs"] == 1 and stops["events"][-1]["requeue"] is False, stops
    assert len(attempts(out)) == 2
    same_training(out, reference)
    assert "restarted in place" in status_text(run)


def test_a_restart_that_fails_the_same_way_falls_back_to_a_requeue(slurm_cluster, reference, tmp_path):
    run = train(tmp_path / "run", "inplace.fault=hang", "inplace.fault_at=4", "inplace.fault_steps=2")
    out = run.task_dir("train")
    (job,) = job_ids(run).values()
    wait_until(lambda: len(hang_reports(out)) == 2, 180, "the second hang")
    release(slurm_cluster, job)  # the requeued job waits for its begin time
    finished(run, restarts=1)
    (event,) = restarts_in_place(out)
    assert event["failure"] == "hang", event
    second = sorted(hang_reports(out), key=lambda r: r["time"])[-1]
    assert second["decision"]["requeue"] is True, second
    stops = json.loads((out / "checkpoints" / "requeue.json").read_text())
    assert stops["hangs"] == 2, stops
    tags = [a["tag"] for a in attempts(out)]
    assert [t.split("-")[1:3] for t in tags] == [["0", "0"], ["0", "1"], ["1", "0"]], tags
    same_training(out, reference)


def kill_ranks_on(out: Path, tag: str, node: str) -> None:
    """The ranks of the step tagged `tag` that run on `node`, killed as the node's loss takes them."""
    for path in out.glob(f"pid-{tag}*.json"):
        where = json.loads(path.read_text())
        if where["node"] == node:
            try:
                os.kill(where["pid"], signal.SIGKILL)
            except ProcessLookupError:
                pass


@pytest.fixture
def failing(slurm_cluster):
    nodes = []
    yield nodes
    for node in nodes:  # the next test must find every node in service: FAIL ends with a resume
        slurm_cluster.run(["scontrol", "update", f"nodename={node}", "state=resume"], check=False)
        bring_back(slurm_cluster, node)


def fail_training_node(slurm_cluster, out: Path, failing: list, which: int, lost: bool = False) -> str:
    """Once every rank of the first step waits at its hold: the `which`-th node its ranks run on fails
    (its ranks killed, the node set FAIL by scontrol), or with `lost`, is lost for real: its slurmd
    killed with every process of the job on it, and SLURM left to notice by itself."""
    (first,) = wait_until(lambda: attempts(out) if (out / "attempts.jsonl").exists() else None, 180,
                          "the first step's start")
    tag = first["tag"]
    pids = wait_until(lambda: [json.loads(p.read_text()) for p in out.glob(f"pid-{tag}*.json")] if len(
        list(out.glob(f"pid-{tag}*.json"))) == first["world_size"] else None, 60, "every rank's pid")
    node = sorted({p["node"] for p in pids})[which]
    wait_until(lambda: (out / "checkpoints" / "step-2" / "COMPLETE.json").is_file(), 120, "the checkpoint of step 2")
    failing.append(node)
    if lost:
        os.kill(int(slurm_cluster.layout.path("run", f"slurmd-{node}.pid").read_text()), signal.SIGKILL)
        for pid in job_processes(first["tag"].split("-")[0], node):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return node
    slurm_cluster.run(["scontrol", "update", f"nodename={node}", "state=fail", "reason=hpc-restart-in-place-test"])
    kill_ranks_on(out, tag, node)
    return node


def fail_mid_training(slurm_cluster, failing: list, tmp_path: Path, which: int, *overrides: str,
                      lost: bool = False) -> tuple:
    """A run held before step 3 whose `which`-th node fails then (`lost`: see fail_training_node); (its
    task directory, the restart's event) once it has completed, and the restart in place recorded."""
    release_file = tmp_path / "release"
    run = train(tmp_path / "run", "inplace.hold_at=3", f"inplace.release={release_file}", *overrides)
    out = run.task_dir("train")
    node = fail_training_node(slurm_cluster, out, failing, which, lost)
    release_file.touch()
    if lost:  # restarted in place well before SlurmdTimeout; the job's end then waits for the node's answer
        wait_until(lambda: (out / nodefail.HISTORY).is_file() and restarts_in_place(out), 90, "the restart in place")
        bring_back(slurm_cluster, node)
    finished(run)
    (event,) = restarts_in_place(out)
    assert (event["failure"], event["failed_nodes"]) == ("node", [node]) and node not in event["nodes"], event
    return out, event


def test_a_failed_node_is_replaced_by_a_spare_in_place(slurm_cluster, reference, failing, tmp_path):
    out, event = fail_mid_training(slurm_cluster, failing, tmp_path, 0, "stages.train.spare_nodes=1")
    assert len(event["nodes"]) == 1, event  # the spare
    first, second = attempts(out)
    assert (first["world_size"], second["world_size"], second["resumed_from"]) == (2, 2, 2)
    same_training(out, reference)


def test_a_node_lost_for_real_restarts_in_place_before_slurm_notices(slurm_cluster, reference, failing, tmp_path):
    """The last node of a node range's job loses its slurmd with the ranks on it: SLURM sets the node DOWN
    only SlurmdTimeout (300 s) later, and srun waits for it until then. Once the other ranks have failed,
    the wrapper sees the node NOT_RESPONDING, ends srun, and restarts on the node left, beside the lost
    node's step (--overlap)."""
    out, event = fail_mid_training(slurm_cluster, failing, tmp_path, -1, "stages.train.nodes=1-2", lost=True)
    assert event["nodes"] == [slurm_cluster.nodes[0]], event
    first, second = attempts(out)
    assert (first["world_size"], second["world_size"], second["resumed_from"]) == (4, 2, 2)
    assert second["time"] - first["time"] < 150, (first, second)  # well before SlurmdTimeout's 300 s
    same_training(out, reference, ATOL)


def test_a_node_range_without_a_spare_shrinks_in_place(slurm_cluster, reference, failing, tmp_path):
    out, event = fail_mid_training(slurm_cluster, failing, tmp_path, 1, "stages.train.nodes=1-2")
    assert len(event["nodes"]) == 1, event  # the one node left
    first, second = attempts(out)
    assert (first["world_size"], second["world_size"], second["resumed_from"]) == (4, 2, 2)
    same_training(out, reference, ATOL)  # another world size: the ranks' sums in another order


@pytest.mark.parametrize("stop", ["preempted", "node failed"])
def test_a_spare_stage_with_its_spare_used_up_is_requeued_without_the_runs_bad_nodes(slurm_cluster, failing,
                                                                                     tmp_path, stop):
    """The job's first node fails its check (the site's command) and the spare takes its place; the run avoids
    that node from its first failure (avoid_after=1). Then a stop from outside (scancel --signal=TERM, requeued
    as a preemption) or the loss of the node the ranks train on (no spare left): either requeue excludes the
    avoided node, the second the failed one too, and asks for the spare again. (Two nodes: the requeued
    job cannot start here, and is cancelled.)"""
    bad, good = slurm_cluster.nodes[:2]
    release_file = tmp_path / "release"
    run = train(tmp_path / "run", "stages.train.spare_nodes=1", "inplace.hold_at=3", f"inplace.release={release_file}",
                fails_on(bad).format("train"), "stages.train.node_check.avoid_after=1")
    out, (job,) = run.task_dir("train"), job_ids(run).values()
    wait_until(lambda: (out / "checkpoints" / "step-2" / "COMPLETE.json").is_file(), 180, "the checkpoint of step 2")
    if stop == "preempted":
        subprocess.run(["scancel", "--signal=TERM", job], check=True)
    else:
        failing.append(good)
        slurm_cluster.run(["scontrol", "update", f"nodename={good}", "state=fail", "reason=hpc-restart-in-place-test"])
        kill_ranks_on(out, attempts(out)[0]["tag"], good)
    release_file.touch()
    try:
        wait_until(lambda: job_field(slurm_cluster, job, "Restarts") == "1" and job_field(
            slurm_cluster, job, "JobState") == "PENDING", 120, "the requeue")
        excluded = set(hostlist.expand(job_field(slurm_cluster, job, "ExcNodeList")))
        assert excluded == ({bad} if stop == "preempted" else {bad, good}), excluded
        assert job_field(slurm_cluster, job, "NumNodes").startswith("2"), "the spare is asked for again"
    finally:
        subprocess.run(["scancel", job], check=False)
    assert [a["tag"].split("-")[1:3] for a in attempts(out)] == [["0", "0"]]  # no step on the bad node
    if stop == "node failed":
        (event,) = [e for e in history(out)["events"] if e["kind"] == "node_failure"]
        assert event["exclude"] == [bad, good] and event["failed_nodes"] == [good], event


# A `run` stage's own script: each rank counts its steps in HPC_CHECKPOINT_DIR and resumes from its count;
# rank 1 dies at step 5 of the allocation's first step.
CRASHING_SCRIPT = """\
import os, pathlib, time
ckpt = pathlib.Path(os.environ["HPC_CHECKPOINT_DIR"])
rank, in_place = os.environ["RANK"], os.environ.get("HPC_RESTART_IN_PLACE", "0")
count = ckpt / f"steps-rank{rank}"
step = int(count.read_text()) if count.exists() else 0
(ckpt / f"started-{in_place}-{rank}").write_text(str(step))
while step < 10:
    time.sleep(0.3)
    step += 1
    (ckpt / "tmp").mkdir(exist_ok=True)
    tmp = ckpt / "tmp" / count.name; tmp.write_text(str(step)); os.replace(tmp, count)
    if rank == "1" and step == 5 and in_place == "0":
        os._exit(3)
"""


def run_script(tmp_path: Path, text: str, timeout_s: float = 240) -> tuple:
    """A `run` stage of one node x 2 ranks running `text`: (its run, its job, its sacct record) once ended."""
    script = tmp_path / "script.py"
    script.write_text(text)
    job = submit_run(tmp_path / "run", script)
    run = RunDir(tmp_path / "run")
    return run, job, wait_until(lambda: (r := ended(run)) and r, timeout_s, "the job's end")[job]


def test_a_run_script_whose_rank_dies_restarts_in_place_and_resumes_itself(slurm_cluster, tmp_path):
    run, job, record = run_script(tmp_path, CRASHING_SCRIPT)
    assert (record.state, record.restarts) == ("COMPLETED", 0), record
    out = run.task_dir("main")
    ckpt = next(p.parent for p in out.rglob("steps-rank0"))
    assert [steps_of(ckpt, r) for r in (0, 1)] == [10, 10]
    assert int((ckpt / "started-1-1").read_text()) == 5  # rank 1 resumed from its own count
    (event,) = restarts_in_place(out)
    assert event["failure"] == "error", event  # its runner raised: the script exited 3


def wrapper_lines(run: RunDir, job: str) -> list:
    """What hpc's srun wrapper said in the job's log about each failed srun step."""
    text = (run.path / "main" / "logs" / job / f"{job}_0_log.err").read_text()
    return [line for line in text.splitlines() if line.startswith("[hpc] srun exited")]


def test_a_script_that_fails_at_once_restarts_once_then_ends_failed_with_its_error(slurm_cluster, tmp_path):
    """A deterministic error (the script raises before any checkpoint) is not retried in a loop: one restart
    in place, then the job ends FAILED, its last line naming the error and where to read it."""
    run, job, record = run_script(tmp_path, "raise ValueError('learning_rate must be positive')\n", 120)
    assert (record.state, record.restarts) == ("FAILED", 0), record
    (event,) = restarts_in_place(run.task_dir("main"))
    assert (event["failure"], event["progress"]) == ("error", None), event
    first, last = wrapper_lines(run, job)
    assert "restart in place 1 of at most 3, from the start (no checkpoint yet)" in first, first
    assert ("not restarted in place: a rank exited with an error before any checkpoint again, as before the last "
            "restart in place; the job ends failed: RuntimeError: command") in last, last
    assert "HINT: python -m hpc.logs" in last, last


# Each rank counts its runs; rank 1 dies (SIGABRT, as a torch teardown crash at interpreter exit) once the
# task's done marker says its work is complete.
ABORT_AFTER_DONE = """\
import os, pathlib, time
ckpt = pathlib.Path(os.environ["HPC_CHECKPOINT_DIR"]); ckpt.mkdir(parents=True, exist_ok=True)
with open(ckpt / f"runs-rank{os.environ['RANK']}", "a") as f:
    f.write(os.environ.get("HPC_RESTART_IN_PLACE", "0") + "\\n")
if os.environ["RANK"] == "1":
    until = time.monotonic() + 60
    while not (ckpt.parent / "done").exists() and time.monotonic() < until:
        time.sleep(0.1)
    os.abort()
"""


def test_a_rank_that_dies_after_its_task_is_done_costs_no_rerun(slurm_cluster, tmp_path):
    run, job, record = run_script(tmp_path, ABORT_AFTER_DONE, 120)
    assert (record.state, record.restarts) == ("COMPLETED", 0), record
    ckpt = run.task_dir("main") / "checkpoints"
    assert [(ckpt / f"runs-rank{r}").read_text() for r in (0, 1)] == ["0\n", "0\n"]  # each rank ran once
    (line,) = wrapper_lines(run, job)
    assert "the task had finished its work" in line and "the job ends completed" in line, line
