"""The hang watchdog of an unmodified script (hpc.scripts.scriptwatch): its heartbeat, its request for
every rank's stacks, the stacks by faulthandler when py-spy is missing, and the suspect."""

import os
import subprocess
import sys
import time

from hpc.scripts import hooks
from hpc.scripts.scriptwatch import ScriptWatch, dump_stacks, suspect

# says it is ready from inside the function its stacks must show: a signal may come right after
SLEEPER = "import time\ndef stuck_here():\n    print('ready', flush=True)\n    time.sleep(60)\nstuck_here()\n"


def test_progress_is_output_growing_or_a_new_line_matching_the_heartbeat(tmp_path):
    log = tmp_path / "0.out"
    log.write_text("")
    watch = ScriptWatch(tmp_path / "hangs", 0, 1, "h", timeout_s=0.3, logs=[log], pid=os.getpid(),
                        pattern=r"step \d+", poll_s=0.05)
    with open(log, "a") as fh:
        fh.write("loading data...\n")
    time.sleep(0.2)
    assert watch.look() == "watching"
    time.sleep(0.2)  # 0.4 s since the last step line, though the log grew
    with open(log, "a") as fh:
        fh.write("still loading\n")
    assert watch._idle() > 0.3
    with open(log, "a") as fh:
        fh.write("step 12 loss 0.1\n")
    assert watch._idle() < 0.1


def test_a_script_still_starting_has_the_startup_allowance_then_the_hang_timeout(tmp_path):
    log = tmp_path / "0.out"
    log.write_text("")
    watch = ScriptWatch(tmp_path / "hangs", 0, 1, "h", timeout_s=0.1, logs=[log], pid=os.getpid(), poll_s=0.05,
                        startup_s=0.6)
    assert watch.startup_s == 0.6
    with open(log, "a") as fh:  # a requeued attempt appends to the same log: hpc's lines are not the script's
        fh.write("[hpc] framework preset: none\nhpc.launch: OMP_NUM_THREADS=1 for each of this node's 2 tasks\n")
    time.sleep(0.3)  # importing torch, joining the rendezvous: silent longer than timeout_s
    assert watch.look() == "watching" and not watch._started
    with open(log, "a") as fh:
        fh.write("step 0\n")
    assert watch.look() == "watching"
    time.sleep(0.2)  # silent again, now past the first progress
    assert watch.look() == "fired"
    assert ScriptWatch(tmp_path / "h2", 0, 1, "h", timeout_s=5, logs=[log], pid=1).startup_s == 300
    assert ScriptWatch(tmp_path / "h3", 0, 1, "h", timeout_s=900, logs=[log], pid=1).startup_s == 900


def test_without_py_spy_the_script_writes_its_own_stacks_to_its_log(tmp_path, monkeypatch):
    err = tmp_path / "0.err"
    env = {**os.environ, **hooks.environ(hooks_preset(), tmp_path, os.environ.get("PYTHONPATH", ""))}
    with open(err, "w") as fh:
        proc = subprocess.Popen([sys.executable, "-u", "-c", SLEEPER], env=env, stdout=subprocess.PIPE, stderr=fh,
                                text=True)
    assert proc.stdout.readline().strip() == "ready"
    monkeypatch.setenv("PATH", str(tmp_path))  # no py-spy
    stacks, where = dump_stacks(proc.pid, err)
    deadline = time.monotonic() + 20
    while "stuck_here" not in err.read_text() and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.kill()
    proc.wait()
    assert stacks == "" and where == str(err)
    assert "stuck_here" in err.read_text()


def hooks_preset():
    from hpc.scripts.presets import PRESETS

    return PRESETS["none"]


def test_rank_0_asks_gathers_and_names_the_rank_not_in_a_collective(tmp_path, monkeypatch):
    import hpc.scripts.scriptwatch as sw

    dumps = {100: "Thread 100 (idle): \"MainThread\"\n    all_reduce (distributed_c10d.py:1)\n",
             101: "Thread 101 (idle): \"MainThread\"\n    read_shard (data.py:9)\n"}
    monkeypatch.setattr(sw, "dump_stacks", lambda pid, log: ("Process\n\n" + dumps[pid], "py-spy"))
    log = tmp_path / "0.out"
    log.write_text("")
    zero = ScriptWatch(tmp_path / "hangs", 0, 2, "n1", timeout_s=0.1, logs=[log], pid=100, poll_s=0.05, gather_s=5,
                       startup_s=0.1)
    one = ScriptWatch(tmp_path / "hangs", 1, 2, "n2", timeout_s=0.1, logs=[], pid=101, poll_s=0.05)
    time.sleep(0.15)
    assert one.look() == "watching"  # no request yet
    assert zero.look() == "fired"
    assert one.look() == "answered"
    assert zero.look() == "done" and zero.fired.is_set()
    assert zero.report["stuck"] == [1] and zero.report["hosts"] == {"1": "n2"}
    written = zero.write({"requeue": True, "why": "hang"})
    assert written["decision"]["requeue"] and (tmp_path / "hangs" / "report.json").exists()


def test_a_main_thread_in_a_collective_is_not_a_suspect():
    assert not suspect('Thread 1 (idle): "MainThread"\n    barrier (torch/distributed/distributed_c10d.py:4)\n')
    assert suspect('Thread 1 (active): "MainThread"\n    decode_jpeg (data.py:20)\n')
