import subprocess
import sys

import pytest

from hpc.runtime.distenv import EnvError
from hpc.launch import prepare
from test_env import srun_task


def test_exports_torchrun_variables_from_slurm():
    child = prepare(srun_task(3, CUDA_VISIBLE_DEVICES="0,1"))
    assert {k: child[k] for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE",
                                  "MASTER_ADDR", "GROUP_RANK")} == {
        "RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2",
        "MASTER_ADDR": "n1", "GROUP_RANK": "1"}
    assert child["SLURM_JOB_ID"] == "1234"  # the rest of the environment is kept


def test_omp_threads_one_per_task_as_torchrun_sets_them_unless_given():
    assert prepare(srun_task(3, CUDA_VISIBLE_DEVICES="0,1"))["OMP_NUM_THREADS"] == "1"  # 2 tasks a node
    assert prepare(srun_task(3, CUDA_VISIBLE_DEVICES="0,1", OMP_NUM_THREADS="6"))["OMP_NUM_THREADS"] == "6"
    assert "OMP_NUM_THREADS" not in prepare(srun_task(1, ntasks=2, nodes=2))  # one task a node: left alone


def test_one_gpu_per_task_breaks_local_rank_indexing():
    with pytest.raises(EnvError, match="cuda:1, which does not exist.*HINT"):
        prepare(srun_task(1, CUDA_VISIBLE_DEVICES="5"))


def test_execs_the_command_with_the_variables():
    code = "import os; print(os.environ['RANK'], os.environ['WORLD_SIZE'], os.environ['MASTER_PORT'])"
    out = subprocess.run([sys.executable, "-m", "hpc.launch", "--", sys.executable, "-c", code],
                         env=srun_task(2, PATH="/usr/bin:/bin", HPC_MASTER_PORT="23456"),
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["2", "4", "23456"]


def test_exit_status_is_the_commands():
    out = subprocess.run([sys.executable, "-m", "hpc.launch", "--", "false"],
                         env=srun_task(0, PATH="/usr/bin:/bin"), capture_output=True, timeout=60)
    assert out.returncode == 1


def test_batch_script_refused_with_hint():
    env = {"PATH": "/usr/bin:/bin", "SLURM_JOB_ID": "5", "SLURM_NTASKS": "4"}
    out = subprocess.run([sys.executable, "-m", "hpc.launch", "--", "true"], env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "HINT: start the program with `srun" in out.stderr


def test_free_ports_come_from_below_the_ephemeral_range_and_skip_taken_ones():
    """hpc.runtime.ports: never a port the kernel hands to outgoing connections, never one that is bound."""
    import socket

    from hpc.runtime import ports

    ephemeral_lo = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
    assert ports.PORTS.stop <= ephemeral_lo
    held = []
    try:
        for port in ports.PORTS[7::8][1:]:  # every port of slice 7 (no test worker's) but its first
            sock = socket.socket()
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                sock.close()
                continue
            held.append(sock)
        free = {ports.free_port(7, 8) for _ in range(20)}
        assert free == {ports.PORTS[7::8][0]}  # the one left, every time
        assert len(held) > 50
    finally:
        for sock in held:
            sock.close()
    with pytest.raises(ValueError, match="slot=4 of slots=4"):
        ports.free_port(4, 4)
