"""faults.slurmshim: wrappers that make SLURM's clients fail on chosen calls, over fake real clients."""
import subprocess
from concurrent.futures import ThreadPoolExecutor

from faults.slurmshim import EMPTY, QUEUED_THEN_TIMEOUT, TIMEOUT, UNREACHABLE, SlurmShim, hang

FAKE = "#!/bin/sh\necho \"real $(basename $0) $*\"\necho ran >> {marks}/$(basename $0)\n"


def _shim(tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    for name in ("sbatch", "squeue", "scontrol", "sacct"):
        (real / name).write_text(FAKE.format(marks=tmp_path))
        (real / name).chmod(0o755)
    shim = SlurmShim(tmp_path / "shim")
    env = shim.env({"PATH": f"{real}:/usr/bin:/bin"})
    return shim, env


def _call(env, *argv, timeout=None):
    return subprocess.run(list(argv), env=env, capture_output=True, text=True, timeout=timeout)


def test_chosen_calls_fail_with_slurms_words_and_others_reach_the_real_client(tmp_path):
    shim, env = _shim(tmp_path)
    shim.rule("squeue", [1, 2], TIMEOUT)
    outs = [_call(env, "squeue", "-h") for _ in range(3)]
    assert [o.returncode for o in outs] == [1, 1, 0]
    assert outs[0].stderr.strip() == "squeue: error: slurm_load_jobs error: Socket timed out on send/recv operation"
    assert outs[2].stdout.strip() == "real squeue -h"
    assert (tmp_path / "squeue").read_text() == "ran\n"  # the refused calls never reached it
    assert shim.calls("squeue") == [["squeue", "-h"]] * 3


def test_after_runs_the_real_client_then_fails_and_empty_answers_nothing(tmp_path):
    shim, env = _shim(tmp_path)
    shim.rule("sbatch", [1], QUEUED_THEN_TIMEOUT).rule("squeue", [1], EMPTY)
    out = _call(env, "sbatch", "x.sh")
    assert out.returncode == 1 and out.stdout == "" and "Socket timed out" in out.stderr
    assert (tmp_path / "sbatch").read_text() == "ran\n"
    out = _call(env, "squeue")
    assert (out.returncode, out.stdout) == (0, "")


def test_rules_per_first_argument_count_those_calls_only(tmp_path):
    shim, env = _shim(tmp_path)
    shim.rule("scontrol", [2], UNREACHABLE, arg="requeue")
    outs = [_call(env, "scontrol", *a) for a in (["requeue", "1"], ["show", "job"], ["requeue", "1"])]
    assert [o.returncode for o in outs] == [0, 0, 1]
    assert outs[2].stderr.strip() == "scontrol: error: Unable to contact slurm controller (connect failure)"


def test_concurrent_calls_are_counted_once_each(tmp_path):
    shim, env = _shim(tmp_path)
    shim.rule("sacct", [5], TIMEOUT)
    with ThreadPoolExecutor(8) as pool:
        codes = list(pool.map(lambda _: _call(env, "sacct").returncode, range(12)))
    assert sorted(codes) == [0] * 11 + [1]
    assert len(shim.calls("sacct")) == 12


def test_hang_sleeps_past_a_callers_timeout(tmp_path):
    shim, env = _shim(tmp_path)
    shim.rule("squeue", [1], hang(5))
    try:
        _call(env, "squeue", timeout=0.8)
        raise AssertionError("no timeout")
    except subprocess.TimeoutExpired:
        pass
    assert _call(env, "squeue").returncode == 0
