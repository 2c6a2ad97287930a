"""The node check before a stage's ranks start, its pure and local parts: one node's probe (site command,
GPU device files from gres.conf, the CPU, a collective across two processes), the verdict from the nodes'
answers, the run's records and avoid list, and the line the batch script exports.

    python -m pytest tests/test_nodecheck.py

What SLURM does with a failed check (a requeue without the node) is tested on the real cluster
(tests/slurm/test_nodecheck.py).
"""
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpc import submit
from hpc.pipeline import plan, sbatch
from hpc.recovery import nodecheck, nodecheckprobe, nodecheckrecord

ROOT = Path(__file__).resolve().parents[1]
FAIL_ON_N2 = 'test "$SLURMD_NODENAME" != n2 || { echo "ECC errors on gpu3"; exit 4; }'


def test_a_site_command_fails_only_the_node_it_names():
    for node, ok in (("n1", True), ("n2", False)):
        said = nodecheckprobe.probe({"builtin": False, "command": FAIL_ON_N2}, {"SLURMD_NODENAME": node,
                                                                                "PATH": os.environ["PATH"]})
        assert (said["node"], said["ok"]) == (node, ok)
        assert said["reasons"] == ([] if ok else ["site check exited 4: ECC errors on gpu3"])


def test_a_site_command_that_hangs_fails_within_the_bound():
    start = time.monotonic()
    said = nodecheckprobe.probe({"builtin": False, "command": "sleep 30", "timeout_s": 3}, {"PATH": os.environ["PATH"]})
    assert time.monotonic() - start < 10
    assert not said["ok"] and "did not end within" in said["reasons"][0]


def gres(tmp_path, node="n2"):
    (tmp_path / "dev").mkdir()
    for n in ("n1", "n2"):
        for i in range(2):
            (tmp_path / "dev" / f"{n}-gpu{i}").write_text("")
    (tmp_path / "gres.conf").write_text("".join(f"NodeName={n} Name=gpu File={tmp_path}/dev/{n}-gpu[0-1]\n"
                                                for n in ("n1", "n2")))
    return {"SLURM_CONF": str(tmp_path / "slurm.conf"), "SLURMD_NODENAME": node, "SLURM_JOB_GPUS": "0,1"}


def test_the_gpus_the_job_was_given_are_checked_by_their_device_files(tmp_path):
    env = gres(tmp_path)
    assert nodecheckprobe.probe({}, env)["ok"]
    (tmp_path / "dev" / "n2-gpu1").unlink()  # n2's second GPU gone; n1's are all there
    said = nodecheckprobe.probe({}, env)
    assert not said["ok"] and said["reasons"] == [f"GPU device file {tmp_path}/dev/n2-gpu1: No such file or directory"]
    assert nodecheckprobe.probe({}, {**env, "SLURMD_NODENAME": "n1"})["ok"]
    assert nodecheckprobe.probe({"builtin": False}, env)["ok"]  # builtin: false leaves the GPUs unchecked


def test_without_gres_files_the_gpus_are_dev_nvidia(tmp_path):
    assert nodecheckprobe.device_files({"SLURM_CONF": str(tmp_path / "slurm.conf")}, "n1", ["0", "3"]) == \
        ["/dev/nvidia0", "/dev/nvidia3"]
    assert nodecheckprobe.gpu_indices({"CUDA_VISIBLE_DEVICES": "2,3"}) == ["2", "3"]
    assert nodecheckprobe.gpu_indices({"SLURM_STEP_GPUS": "1", "CUDA_VISIBLE_DEVICES": "0"}) == ["1"]
    assert nodecheckprobe.gpu_indices({}) == []


def probe_process(rank, port_job, options):
    env = {**os.environ, "SLURMD_NODENAME": f"n{rank + 1}", "SLURM_PROCID": str(rank), "SLURM_NTASKS": "2",
           "SLURM_STEP_NODELIST": "localhost", "SLURM_JOB_ID": str(port_job), "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-m", "hpc.recovery.nodecheckprobe", json.dumps(options)], env=env,
                            stdout=subprocess.PIPE, text=True)


def test_the_collective_joins_every_node_and_fails_within_the_bound_without_a_peer():
    job = 4000 + os.getpid() % 3000
    options = {"builtin": False, "collective": True, "collective_mb": 1, "timeout_s": 40}
    both = [probe_process(rank, job, options) for rank in (0, 1)]
    said = nodecheck.answers("".join(p.communicate(timeout=120)[0] for p in both))
    assert sorted(said) == ["n1", "n2"] and all(a["ok"] for a in said.values()), said
    assert nodecheck.judge(["n1", "n2"], said, [], "-") == (["n1", "n2"], {}, "the collective passed on 2 node(s)")
    start = time.monotonic()  # rank 0 alone: its peer never comes
    alone = nodecheck.answers(probe_process(0, job + 1, {**options, "timeout_s": 6}).communicate(timeout=120)[0])
    assert time.monotonic() - start < 40
    assert "all_reduce of 1 MB across 2 node(s)" in alone["n1"]["collective"], alone
    # every node sees a collective's failure, whichever caused it: it is noted, and fails no node by itself
    healthy, failed, note = nodecheck.judge(["n1", "n2"], {"n1": alone["n1"]}, [], "none within 6 s")
    assert (healthy, failed) == (["n1"], {"n2": "no answer (none within 6 s)"}) and "collective failed" in note


def test_judge_fails_what_did_not_answer_and_what_is_avoided_and_blames_no_node_when_none_answered():
    ok = {"ok": True, "reasons": []}
    said = {"n1": ok, "n3": {"ok": False, "reasons": ["x", "y"]}}
    healthy, failed, note = nodecheck.judge(["n1", "n2", "n3"], said, [], "srun: error: n2: task 1: Exited")
    assert (healthy, failed, note) == (["n1"], {"n2": "no answer (srun: error: n2: task 1: Exited)", "n3": "x; y"}, "")
    healthy, failed, _ = nodecheck.judge(["n1", "n2"], {"n1": ok}, ["n2"], "-")
    assert healthy == ["n1"] and failed["n2"].startswith(nodecheckrecord.AVOIDED)
    healthy, failed, note = nodecheck.judge(["n1", "n2"], {}, [], "-")
    assert (healthy, failed) == (["n1", "n2"], {}) and "check step failed" in note


def test_the_step_is_one_task_per_node_on_the_nodes_named():
    argv = nodecheck.srun_command(["n1", "n3"], {"command": "true"}, python="py")
    assert argv[:5] == ["srun", "--nodes=2", "--ntasks=2", "--ntasks-per-node=1", "--nodelist=n1,n3"]
    assert argv[-5:] == ["py", "-u", "-m", "hpc.recovery.nodecheckprobe", json.dumps({"command": "true"})]
    mark = nodecheckprobe.MARK
    output = "junk\n" + mark + json.dumps({"node": "n3", "ok": True}) + "\n" + mark + "{\n"
    assert list(nodecheck.answers(output)) == ["n3"]


def test_a_node_is_avoided_after_avoid_after_failed_checks_in_the_run(tmp_path):
    def check(failed, job="7"):
        return nodecheckrecord.write(tmp_path, job, "0", ["n1", "n2"], failed, {"n1": {"wall_s": 1, "cpu_s": 1}})

    first = check({"n2": "site check exited 4: ECC"})
    assert json.loads(first.read_text())["failed"] == {"n2": "site check exited 4: ECC"}
    assert nodecheckrecord.avoided(tmp_path, 2) == [] and nodecheckrecord.avoided(tmp_path, 1) == ["n2"]
    check({"n2": "no answer within 60 s"}, job="8")
    assert nodecheckrecord.avoided(tmp_path, 2) == ["n2"]
    check({"n2": nodecheckrecord.AVOIDED + " not checked again", "n1": "x"}, job="8")  # avoided: not counted again
    assert nodecheckrecord.failures(nodecheckrecord.records(tmp_path)) == {"n2": 2, "n1": 1}
    check({}, job="9")
    assert sorted(p.name for p in (tmp_path / "nodecheck").iterdir()) == \
        ["7-0-0.failed.json", "8-0-0.failed.json", "8-0-1.failed.json", "9-0-0.json"]
    assert len(nodecheckrecord.records(tmp_path)) == 4 and len(nodecheckrecord.records(tmp_path, True)) == 3
    on = {nodecheck.ENV: json.dumps({"enabled": True, "avoid_after": 2})}
    assert nodecheck.avoided(tmp_path, on) == ["n2"] and nodecheck.avoided(tmp_path, {}) == []
    nodecheckrecord.done(first, "requeued with ExcNodeList=n2")
    assert nodecheckrecord.requeues(tmp_path, "7") == 1 and nodecheckrecord.requeues(tmp_path, "8") == 0


def test_the_batch_script_exports_the_check_only_when_it_is_on():
    res = {"nodes": 2, "max_node_failures": 3}
    assert not any("HPC_NODE_CHECK" in line for line in sbatch.afterstep_setup(res, "/r", python="py"))
    section = {"enabled": False, "command": FAIL_ON_N2, "timeout_s": 20.0}
    line = sbatch.afterstep_setup({**res, "node_check": section}, "/r", python="py")[-1]
    name, _, value = shlex.split(line)[1].partition("=")
    assert name == nodecheck.ENV and nodecheck.options({name: value}) == section
    assert nodecheck.options({nodecheck.ENV: json.dumps({"enabled": False, "command": ""})}) is None


def test_a_check_that_cannot_run_never_stops_the_job(tmp_path):
    env = {"SLURM_JOB_NODELIST": "n[1-2]", "SLURM_JOB_ID": "5", "PATH": str(tmp_path),  # no srun on PATH
           nodecheck.ENV: json.dumps({"enabled": True})}
    verdict = nodecheck.before_step(str(tmp_path), env, lambda *a: "")
    assert verdict.go and verdict.line.startswith("node check not run: FileNotFoundError")
    assert nodecheck.before_step(str(tmp_path), {}, lambda *a: "") == nodecheck.Verdict(True)


@pytest.mark.parametrize("key, value", [("timeout_s", 0), ("avoid_after", 0), ("collective_mb", -1)])
def test_a_check_option_out_of_range_is_refused_at_submission(key, value, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(plan.PIPELINES, "tiny", "tests.tiny_pipeline")
    code = submit.main(["tiny", "--cluster", "slurm", "--dry-run", "--run-dir", str(tmp_path / "run"),
                        "stages.first.node_check.enabled=true", f"stages.first.node_check.{key}={value}"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert f"stages.first.node_check.{key}={value}" in err and "HINT" in err


def test_where_torch_sees_fewer_cuda_devices_than_were_given_the_node_fails():
    reasons = nodecheckprobe.check_cuda(2)  # this machine's torch sees none
    assert reasons == ["torch sees 0 CUDA device(s) of the 2 given"]


def test_a_check_step_that_does_not_end_is_ended_at_its_bound():
    start = time.monotonic()
    out, trouble = nodecheck.run_step(["sh", "-c", f"echo '{nodecheckprobe.MARK}{{}}'; sleep 60"], 1.0, os.environ)
    assert time.monotonic() - start < 15 and trouble == "srun did not end within 1 s"
    assert out.startswith(nodecheckprobe.MARK)  # what came before the end is still read
