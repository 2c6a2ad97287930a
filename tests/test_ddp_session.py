"""DDP session tests with real gloo process groups on this machine (torchrun-style variables).

The same workloads run under srun on the local cluster in tests/slurm/test_ddp.py.
"""

import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import hpc.ddp
from hpc.runtime import ports
from hpc.runtime.distenv import EnvError
from hpc.runtime.envparse import from_environ

import ranklaunch

WORKLOAD = Path(__file__).with_name("ddp_workload.py")


def free_port() -> int:
    """A port for a rendezvous of this worker's ranks, from its own slice (hpc.runtime.ports)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")[2:]
    return ports.free_port(int(worker) % 8 if worker.isdigit() else 0, 8)


def start_local(workload, world, out, *extra, stderr=subprocess.PIPE):
    """Start `world` processes as torchrun would (same variables, one port)."""
    out.mkdir(parents=True, exist_ok=True)
    port = str(free_port())
    procs = []
    for rank in range(world):
        env = {"PATH": "/usr/bin:/bin", "RANK": str(rank), "LOCAL_RANK": str(rank),
               "WORLD_SIZE": str(world), "LOCAL_WORLD_SIZE": str(world),
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "OMP_NUM_THREADS": "1"}
        cmd = [sys.executable, str(WORKLOAD), workload, str(out), *extra]
        procs.append(ranklaunch.popen(cmd, env=env, stderr=stderr, text=True))
    return procs


def run_local(workload, world, out, *extra, timeout=120):
    """Run to the end; return the exit codes, the elapsed time and each rank's stderr."""
    started = time.monotonic()
    procs = start_local(workload, world, out, *extra)
    codes = [p.wait(timeout=timeout) for p in procs]
    errors = [p.stderr.read() for p in procs]
    return codes, time.monotonic() - started, errors


def results(out, world):
    return [json.loads((out / f"rank-{r}.json").read_text()) for r in range(world)]


def test_single_process_session_needs_no_process_group(tmp_path):
    with hpc.ddp.session(env=from_environ({})) as s:
        assert (s.rank, s.world_size, s.is_main, str(s.device)) == (0, 1, True, "cpu")
        assert s.all_reduce_mean(3.5) == 3.5
        model = s.wrap(torch.nn.Linear(2, 2))
        assert isinstance(model, torch.nn.Linear)  # no DDP wrapper for one process
        with s.writer(tmp_path / "tb") as w:
            w.add_scalar("loss", 1.0, 0)
        assert any((tmp_path / "tb").iterdir())
        assert list(s.progress(range(3), disable=True)) == [0, 1, 2]
        loader = s.loader(list(range(10)), batch_size=5, seed=3)
        s.set_epoch(0)
        first = [b.tolist() for b in loader]
        s.set_epoch(1)
        assert first != [b.tolist() for b in loader] and len(first) == 2


def test_a_rank_without_tensorboard_is_told_what_to_do(tmp_path, monkeypatch):
    """In a container image without tensorboard (hpc carries only pure-Python packages in: docs/containers.md)."""
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # as if not installed
    s = hpc.ddp.Session(from_environ({}), torch.device("cpu"))
    with pytest.raises(ImportError, match="HINT: install tensorboard in the container image, or pass tensorboard="):
        s.writer(tmp_path / "tb")


def test_other_ranks_get_a_writer_that_does_nothing(tmp_path):
    env = from_environ({"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "x",
                        "MASTER_PORT": "29999"})
    s = hpc.ddp.Session(env, torch.device("cpu"))
    with s.writer(tmp_path / "tb") as w:
        w.add_scalar("loss", 1.0, 0)
        w.flush()
    assert not (tmp_path / "tb").exists()
    assert s.progress([1, 2]) == [1, 2] and not s.is_main


def test_four_ranks_agree_on_all_reduce(tmp_path):
    codes, _, errors = run_local("allreduce", 4, tmp_path)
    assert codes == [0] * 4, errors
    for r in results(tmp_path, 4):
        assert r["sum"] == 10.0 and r["mean"] == [1.5, 1.0] and r["source"] == "torchrun"


def test_accumulation_matches_more_devices(tmp_path):
    weights = {}
    for world in (1, 2, 4):
        out = tmp_path / f"w{world}"
        codes, _, errors = run_local("train", world, out, "--global-batch", "16",
                                     "--per-device-max", "4")
        assert codes == [0] * world, errors
        assert results(out, world)[0]["accum_steps"] == 4 // world
        weights[world] = torch.load(out / "weights.pt", weights_only=True)
    for world in (2, 4):
        for name, tensor in weights[1].items():
            assert torch.allclose(tensor, weights[world][name], atol=1e-6, rtol=0), name
    # and training really moved the weights: equal only because the maths is equal
    torch.manual_seed(0)
    fresh = torch.nn.Linear(8, 16).double()
    assert not torch.allclose(fresh.weight, weights[1]["0.weight"])


def test_failing_rank_fails_the_others_within_timeout(tmp_path):
    codes, elapsed, errors = run_local("fail", 3, tmp_path, "--timeout", "20")
    assert all(code != 0 for code in codes), codes
    assert "rank 1 fails on purpose" in errors[1]
    assert elapsed < 20 + 15, elapsed
    assert all((tmp_path / f"rank-{r}.elapsed").exists() for r in (0, 2)), (codes, [e[-2000:] for e in errors])


def test_hung_rank_times_out_the_others(tmp_path):
    out = tmp_path
    procs = start_local("hang", 3, out, "--timeout", "4", stderr=subprocess.DEVNULL)
    try:
        codes = [procs[r].wait(timeout=60) for r in (0, 2)]
    finally:
        procs[1].kill()
        procs[1].wait()
    assert all(code != 0 for code in codes), codes
    waited = [float((out / f"rank-{r}.elapsed").read_text()) for r in (0, 2)]
    assert all(3.5 < w < 15 for w in waited), waited


def test_no_rank_tears_down_before_every_rank_has_finished(tmp_path):
    """The exit rendezvous: a rank that destroyed its gloo group while a peer was still working
    could abort that peer at exit. Here the last rank is still busy when the others finish; no
    rank's teardown may start before every rank has left the session's body."""
    codes, _, errors = run_local("leave", 3, tmp_path, "--timeout", "30")
    assert codes == [0, 0, 0], errors
    for rank in range(3):
        assert json.loads((tmp_path / f"teardown-{rank}.json").read_text()) == [0, 1, 2], rank


def test_the_session_ends_only_once_the_gloo_workers_are_idle(tmp_path):
    """A gloo worker still running as the session ends would free its collective's tensors while the
    interpreter ends, and abort the process (SIGABRT) after its work was done. Each rank's worker
    here computes for 1.5 s past the session's body; the session must return after it finished."""
    codes, _, errors = run_local("lagging", 2, tmp_path, "--lag-s", "1.5")
    assert codes == [0, 0], errors
    for rank in range(2):
        assert json.loads((tmp_path / f"after-{rank}.json").read_text()) == {"worker_done": True}, rank


def test_a_peer_that_left_by_an_exception_delays_the_exit_by_the_bound_only(monkeypatch):
    """rendezvous_exit answers False (and the caller tears down) when a peer never checks in."""
    from hpc.runtime.teardown import rendezvous_exit

    store = torch.distributed.HashStore()
    started = time.monotonic()
    assert rendezvous_exit(store, rank=0, world_size=2, generation=1, timeout_s=0.5) is False
    assert time.monotonic() - started < 30  # bounded by its own timeout, not the group's
    # the peer of the next exit has checked in already, and will have seen the release
    store.add("hpc/exit/2/arrived", 1)
    store.add("hpc/exit/2/released", 1)
    assert rendezvous_exit(store, rank=0, world_size=2, generation=2, timeout_s=5) is True


def torchrun_env(rank, world, **extra):
    return from_environ({"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world),
                         "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29999", **extra})


def test_device_from_local_rank_and_torch_count():
    # torchrun, or a site without gres binding: no CUDA_VISIBLE_DEVICES, the GPUs torch sees
    assert hpc.ddp._pick_device(torchrun_env(1, 2), cuda_count=2) == torch.device("cuda", 1)
    assert hpc.ddp._pick_device(torchrun_env(1, 2), cuda_count=0) == torch.device("cpu")
    assert hpc.ddp._cuda_count() == (torch.cuda.device_count() if torch.cuda.is_available() else 0)


def test_world_1_with_several_gpus_is_a_warning(caplog):
    env = torchrun_env(0, 1, CUDA_VISIBLE_DEVICES="0,1")
    with caplog.at_level(logging.WARNING, logger="hpc.ddp"):
        assert hpc.ddp._pick_device(env, cuda_count=2) == torch.device("cuda", 0)
        with hpc.ddp.session(env=env) as s:  # no CUDA here: runs on the CPU, says so
            assert s.world_size == 1
    assert "world size 1 but 2 GPUs" in caplog.text


def test_more_tasks_than_gpus_refused_before_init():
    env = torchrun_env(0, 4, CUDA_VISIBLE_DEVICES="0,1")
    with pytest.raises(EnvError, match="4 tasks on this node but 2 GPUs.*HINT"):
        with hpc.ddp.session(env=env, timeout_s=5):
            pass
    assert not torch.distributed.is_initialized()


def test_env_probe_falls_back_to_cpu_without_cuda():
    from hpc.runtime.devicebind import describe

    env = from_environ({"CUDA_VISIBLE_DEVICES": "3"})
    assert describe(env)["device"] == "cuda:0"  # what SLURM's allocation implies
    probed = describe(env, probe_torch=True)
    expected = "cuda:0" if torch.cuda.is_available() else "cpu"
    assert (probed["device"], probed["backend"]) == (expected, "nccl" if expected != "cpu" else "gloo")
