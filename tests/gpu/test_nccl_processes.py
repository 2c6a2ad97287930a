"""NCCL in processes of its own (tests/gpu/nccl_workload.py): the flight recorder, a barrier's
timeout after training started, and hpc.ddp.session's NCCL start-up on two GPUs.

    python -m pytest -n 0 tests/gpu/test_nccl_processes.py
"""

from __future__ import annotations

import json
import os
import pickle
import socket
import subprocess
import sys
import time
from pathlib import Path

from marks import needs_cuda, needs_two_gpus

WORKLOAD = Path(__file__).with_name("nccl_workload.py")
REPO = Path(__file__).resolve().parents[2]
TRAIN_TIMEOUT_S = 5.0
# What NCCL's watchdog may add to a timeout before the process is gone: its polling, the flight
# recorder's dump, the abort. Far below the 600 s start-up timeout the barrier must not wait for.
TEARDOWN_S = 90.0


def _env(**extra: str) -> dict:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLURM_", "RANK", "WORLD_SIZE", "LOCAL_", "MASTER_", "TORCH_NCCL", "TORCH_FR"))}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env.update(extra)
    return env


def _json_lines(text: str) -> list:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


@needs_cuda
def test_the_flight_recorder_records_collectives_and_the_watchdog_dump_writes_them(tmp_path):
    out = subprocess.run([sys.executable, str(WORKLOAD), "trace", str(tmp_path)], env=_env(),
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    result = _json_lines(out.stdout)[-1]
    assert result["sum"] == [1.0, 1.0, 1.0]
    assert result["has_dump"], "this torch has no _dump_nccl_trace: hpc's watchdog would dump nothing"
    dump = tmp_path / "nccl" / "rank-0.watchdog"
    data = dump.read_bytes()
    assert b"all_reduce" in data  # the collective just run is in the record
    trace = pickle.loads(data)
    assert trace["entries"], trace.keys()


@needs_cuda
def test_a_stuck_barrier_fails_within_the_training_timeout_and_dumps_the_recorder(tmp_path):
    proc = subprocess.Popen([sys.executable, str(WORKLOAD), "timeout", str(tmp_path), str(TRAIN_TIMEOUT_S)],
                            env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        armed = None
        for line in proc.stdout:
            if line.startswith('{"armed"'):
                armed = time.time()
                break
        assert armed is not None, proc.stderr.read()[-3000:]
        code = proc.wait(timeout=TRAIN_TIMEOUT_S + TEARDOWN_S)
        ended = time.time()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    rest, errors = proc.stdout.read(), proc.stderr.read()
    assert "returned" not in rest, "the barrier returned while the device was busy"
    assert code != 0, errors[-3000:]
    assert TRAIN_TIMEOUT_S * 0.9 <= ended - armed <= TRAIN_TIMEOUT_S + TEARDOWN_S, (ended - armed, errors[-2000:])
    dumps = sorted(p.name for p in (tmp_path / "nccl").iterdir())
    assert dumps and dumps[0].startswith("rank-0"), (dumps, errors[-2000:])


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@needs_two_gpus
def test_two_ranks_join_over_nccl_each_on_its_own_gpu(tmp_path):
    port, procs = str(_free_port()), []
    checkpoints = tmp_path / "task" / "checkpoints"
    for rank in range(2):
        env = _env(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", LOCAL_WORLD_SIZE="2",
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=port, HPC_CHECKPOINT_DIR=str(checkpoints))
        procs.append(subprocess.Popen([sys.executable, str(WORKLOAD), "ranks", str(tmp_path)], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [err[-2000:] for _, err in outs]
    r = [json.loads((tmp_path / f"rank-{rank}.json").read_text()) for rank in range(2)]
    assert [x["device"] for x in r] == ["cuda:0", "cuda:1"] and {x["backend"] for x in r} == {"nccl"}
    assert [x["device_ids"] for x in r] == [[0], [1]]
    hangs = tmp_path / "task" / "hangs" / "local.0" / "nccl"
    assert {x["trace_prefix"] for x in r} == {str(hangs / "rank-")} and hangs.is_dir()
    assert {x["sum"] for x in r} == {3.0} and [x["mean"] for x in r] == [[0.5], [0.5]]
    assert r[0]["weights"] == r[1]["weights"]  # gradients averaged over both ranks' batches
    assert [x["broadcast"] for x in r] == [{"from": 0}, {"from": 0}]
    assert [x["vote"] for x in r] == ["timeout", "timeout"]  # rank 1's flag, agreed by both
