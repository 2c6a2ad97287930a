"""The rank launcher the multi-process tests share (tests/ranklaunch.py): forked ranks behave as
fresh `python script.py` processes would, each with exactly its own environment, exit code and stderr.

    python -m pytest -q tests/test_ranklaunch.py
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

import ranklaunch

SCRIPT = """
import json, os, sys, threading
print("rank", os.environ["RANK"], "speaks", file=sys.stderr)
out = {"env": dict(os.environ), "argv": sys.argv, "cwd": os.getcwd(), "path0": sys.path[0],
       "main": __name__, "file": __file__, "tasks": len(os.listdir("/proc/self/task")),
       "threads": threading.active_count(), "sid": os.getsid(0) == os.getpid(), "path1": sys.path[1],
       "site": "sitecustomize" in sys.modules and sys.modules["sitecustomize"].__file__}
with open(os.path.join(os.environ["OUT"], "rank-" + os.environ["RANK"] + ".json"), "w") as fh:
    json.dump(out, fh)
how = os.environ.get("END", "0")
if how == "raise":
    raise ValueError("rank fails on purpose")
if how == "message":
    sys.exit("a message instead of a code")
if how == "sleep":
    import time
    time.sleep(120)
sys.exit(int(how))
"""


@pytest.fixture(scope="module")
def zygote():
    """A zygote of its own, whose environment holds a variable no rank is given."""
    z = ranklaunch.Zygote(env={"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1", "ZYGOTE_ONLY": "yes"})
    yield z
    z.close()


def launch(zygote, tmp_path, ends, **kw):
    script = tmp_path / "probe.py"
    script.write_text(SCRIPT)
    site = tmp_path / "site"  # on the ranks' PYTHONPATH: imported at start, as site.py would
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text("")
    envs = [{"PATH": "/usr/bin:/bin", "RANK": str(r), "OUT": str(tmp_path), f"ONLY_RANK_{r}": str(r), "END": end,
             "PYTHONPATH": str(site)} for r, end in enumerate(ends)]
    procs = [zygote.fork([sys.executable, str(script), "a", str(r)], env, cwd=tmp_path, stderr=subprocess.PIPE, **kw)
             for r, env in enumerate(envs)]
    return procs, envs


def report(tmp_path, rank):
    return json.loads((tmp_path / f"rank-{rank}.json").read_text())


def test_each_rank_sees_exactly_its_own_environment(zygote, tmp_path):
    procs, envs = launch(zygote, tmp_path, ["0", "0"])
    assert [p.wait(timeout=60) for p in procs] == [0, 0]
    for rank, env in enumerate(envs):
        seen = report(tmp_path, rank)
        assert seen["env"] == env  # not the zygote's ZYGOTE_ONLY, not the other rank's ONLY_RANK_*
        assert seen["argv"] == [str(tmp_path / "probe.py"), "a", str(rank)]
        assert (seen["cwd"], seen["path0"], seen["main"]) == (str(tmp_path), str(tmp_path), "__main__")
        assert seen["path1"] == str(tmp_path / "site") and seen["site"] == str(tmp_path / "site" / "sitecustomize.py")
        assert (seen["tasks"], seen["threads"], seen["sid"]) == (1, 1, False)  # nothing started before the fork


def test_exit_codes_tracebacks_and_stderr_are_per_rank(zygote, tmp_path):
    procs, _ = launch(zygote, tmp_path, ["0", "3", "raise", "message"])
    results = [p.communicate(timeout=60) for p in procs]
    assert [p.returncode for p in procs] == [0, 3, 1, 1]
    errors = [err for _, err in results]
    for rank, err in enumerate(errors):
        assert f"rank {rank} speaks" in err and all(f"rank {o} speaks" not in err for o in range(4) if o != rank)
    assert "ValueError: rank fails on purpose" in errors[2] and "Traceback" in errors[2]
    assert "a message instead of a code" in errors[3] and "Traceback" not in errors[3]


def test_a_signal_hits_exactly_the_rank_it_is_sent_to(zygote, tmp_path):
    procs, _ = launch(zygote, tmp_path, ["sleep", "sleep", "0"], start_new_session=True)
    with pytest.raises(subprocess.TimeoutExpired):
        procs[0].wait(timeout=0.2)
    assert procs[2].wait(timeout=60) == 0
    procs[0].kill()
    assert procs[0].wait(timeout=30) == -signal.SIGKILL
    assert procs[1].poll() is None  # its neighbour still runs
    procs[1].terminate()
    assert procs[1].wait(timeout=30) == -signal.SIGTERM
    assert report(tmp_path, 0)["sid"] is True


def test_the_shared_zygote_forks_ranks_and_stays_single_threaded(tmp_path):
    script = tmp_path / "probe.py"
    script.write_text(SCRIPT)
    envs = [{"PATH": "/usr/bin:/bin", "RANK": str(r), "OUT": str(tmp_path), "OMP_NUM_THREADS": "1"} for r in range(2)]
    procs = ranklaunch.start([sys.executable, str(script)], envs, stderr=subprocess.PIPE)
    assert [p.communicate(timeout=60)[0] for p in procs] == [None, None] and [p.returncode for p in procs] == [0, 0]
    assert [report(tmp_path, r)["env"] for r in range(2)] == envs
    assert len(os.listdir(f"/proc/{ranklaunch._shared.proc.pid}/task")) == 1


def test_run_is_subprocess_run_under_an_interpreter_wrapper(tmp_path):
    """run(): a script to its end, forked from a zygote of the interpreter wrapper it names (one per
    wrapper's text), its output captured, its stdin closed."""
    wrapper = tmp_path / "bin" / "python"  # as tests/langsplat_standins/checkout.py:make_env writes one
    wrapper.parent.mkdir()
    wrapper.write_text(f'#!/bin/sh\nZYGOTE_ONLY=yes exec "{sys.executable}" "$@"\n')
    wrapper.chmod(0o755)
    (tmp_path / "probe.py").write_text(SCRIPT.replace('print("rank"', 'print(sys.stdin.read() or "out"); print("rank"'))
    env = {"PATH": "/usr/bin:/bin", "RANK": "0", "OUT": str(tmp_path), "END": "3"}
    done = ranklaunch.run([wrapper, "probe.py", "x"], cwd=tmp_path, env=env)
    assert (done.returncode, done.stdout, done.stderr) == (3, "out\n", "rank 0 speaks\n")
    assert report(tmp_path, 0)["env"] == env and report(tmp_path, 0)["argv"] == ["probe.py", "x"]
    failed = ranklaunch.run([wrapper, "probe.py"], cwd=tmp_path, env={**env, "END": "raise"})
    assert failed.returncode == 1 and "ValueError: rank fails on purpose" in failed.stderr
    # one zygote for this wrapper's text, alive, serving both runs (other tests' wrappers have their own)
    mine = ranklaunch._warm[wrapper.read_bytes()]
    assert mine.proc.poll() is None and list(ranklaunch._warm.values()).count(mine) == 1
