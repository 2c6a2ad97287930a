import json
import subprocess
import sys

import pytest

from hpc.env import (EnvError, device_index, from_environ, master_port_for,
                     parse_tasks_per_node, PORT_BASE, PORT_SPAN)


def srun_task(rank, ntasks=4, nodes=2, **extra):
    """What srun gives task `rank` of a nodes x (ntasks/nodes) step (seen on the local cluster)."""
    per_node = ntasks // nodes
    env = {
        "SLURM_JOB_ID": "1234", "SLURM_STEP_ID": "0", "SLURM_PROCID": str(rank),
        "SLURM_LOCALID": str(rank % per_node), "SLURM_NODEID": str(rank // per_node),
        "SLURM_NTASKS": str(ntasks), "SLURM_JOB_NUM_NODES": str(nodes),
        "SLURM_STEP_NUM_NODES": str(nodes), "SLURM_JOB_NODELIST": "n[1-2]",
        "SLURM_STEP_NODELIST": "n[1-2]", "SLURM_STEP_TASKS_PER_NODE": f"{per_node}(x{nodes})",
        "SLURM_TASKS_PER_NODE": f"{per_node}(x{nodes})",
    }
    env.update(extra)
    return env


def test_slurm_task_fields():
    env = from_environ(srun_task(3, SLURM_RESTART_COUNT="2", CUDA_VISIBLE_DEVICES="0,1"))
    assert (env.source, env.rank, env.local_rank, env.world_size) == ("slurm", 3, 1, 4)
    assert (env.node_rank, env.num_nodes, env.local_world_size) == (1, 2, 2)
    assert env.master_addr == "n1" and env.hosts == ("n1", "n2")
    assert env.master_port == PORT_BASE + 1234 % PORT_SPAN
    assert env.job_id == "1234" and env.restart_count == 2
    assert env.visible_devices == ("0", "1") and not env.is_main


def test_step_nodelist_wins_over_job_nodelist():
    env = from_environ(srun_task(0, SLURM_JOB_NODELIST="n[1-4]", SLURM_STEP_NODELIST="n[3-4]"))
    assert env.master_addr == "n3"


def test_uneven_tasks_per_node():
    assert parse_tasks_per_node("2(x3),1") == [2, 2, 2, 1]
    env = from_environ(srun_task(0, SLURM_NODEID="1", SLURM_STEP_TASKS_PER_NODE="3,1"))
    assert env.local_world_size == 1


def test_every_rank_agrees_on_the_rendezvous():
    envs = [from_environ(srun_task(r)) for r in range(4)]
    assert len({(e.master_addr, e.master_port) for e in envs}) == 1
    assert sorted(e.rank for e in envs) == [0, 1, 2, 3]


def test_ports_differ_for_array_tasks_and_jobs():
    ports = {master_port_for("900", "880", t) for t in range(64)}
    assert len(ports) == 64
    assert master_port_for("1000") != master_port_for("1001")
    assert all(PORT_BASE <= p < PORT_BASE + PORT_SPAN for p in ports)
    env = from_environ(srun_task(0, SLURM_ARRAY_JOB_ID="880", SLURM_ARRAY_TASK_ID="5"))
    assert env.master_port == master_port_for(None, "880", 5) and env.array_task_id == 5


@pytest.mark.parametrize("extra, port", [
    ({"HPC_MASTER_PORT": "31000", "MASTER_PORT": "31001"}, 31000),
    ({"MASTER_PORT": "31001"}, 31001),
])
def test_port_override(extra, port):
    assert from_environ(srun_task(0, **extra)).master_port == port


def test_bad_port_override():
    with pytest.raises(EnvError, match="HPC_MASTER_PORT=80 is outside.*HINT"):
        from_environ(srun_task(0, HPC_MASTER_PORT="80"))


@pytest.mark.parametrize("name", ["SLURM_ARRAY_TASK_ID", "SLURM_RESTART_COUNT", "SLURM_STEP_NUM_NODES"])
def test_non_integer_job_field_names_the_variable(name):
    with pytest.raises(EnvError, match=f"{name}='x' is not an integer.*HINT"):
        from_environ(srun_task(0, **{name: "x"}))


def test_partial_slurm_names_missing():
    env = srun_task(0)
    del env["SLURM_LOCALID"], env["SLURM_STEP_TASKS_PER_NODE"], env["SLURM_TASKS_PER_NODE"]
    with pytest.raises(EnvError, match="SLURM_LOCALID, SLURM_NTASKS_PER_NODE missing"):
        from_environ(env)


def test_batch_script_is_not_rank_0_of_n():
    batch = {"SLURM_JOB_ID": "77", "SLURM_NTASKS": "4", "SLURM_PROCID": "0",
             "SLURM_JOB_NODELIST": "n[1-2]"}
    with pytest.raises(EnvError, match="batch script.*HINT: start the program with `srun"):
        from_environ(batch)


def test_single_task_batch_script_is_single():
    env = from_environ({"SLURM_JOB_ID": "77", "SLURM_NTASKS": "1"})
    assert (env.source, env.world_size, env.job_id) == ("single", 1, "77")


def test_single_process():
    env = from_environ({})
    assert (env.source, env.rank, env.world_size, env.master_addr) == ("single", 0, 1, "127.0.0.1")


def test_torchrun_source():
    env = from_environ({"RANK": "5", "LOCAL_RANK": "1", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4",
                        "MASTER_ADDR": "h0", "MASTER_PORT": "29400", "GROUP_RANK": "1"})
    assert (env.source, env.rank, env.node_rank, env.num_nodes) == ("torchrun", 5, 1, 2)
    assert (env.master_addr, env.master_port) == ("h0", 29400)


def test_partial_torchrun_names_missing():
    with pytest.raises(EnvError, match="RANK, WORLD_SIZE set but LOCAL_RANK, MASTER_ADDR, "
                                       "MASTER_PORT missing.*HINT"):
        from_environ({"RANK": "0", "WORLD_SIZE": "2"})


def test_torchrun_inside_srun_wins_when_it_disagrees():
    # torchrun started once per node by srun: SLURM counts nodes, torchrun counts processes.
    env = from_environ(srun_task(1, ntasks=2, RANK="5", LOCAL_RANK="1", WORLD_SIZE="8",
                                 LOCAL_WORLD_SIZE="4", MASTER_ADDR="n1", MASTER_PORT="29400"))
    assert (env.source, env.rank, env.world_size) == ("torchrun", 5, 8)


def test_export_round_trip_stays_slurm():
    base = srun_task(2)
    env = from_environ(base)
    target = dict(base)
    written = env.export(target)
    assert written == {"RANK": "2", "LOCAL_RANK": "0", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2",
                       "MASTER_ADDR": "n1", "MASTER_PORT": str(env.master_port)}
    assert from_environ(target) == env


@pytest.mark.parametrize("devices, rank, expected", [
    ("", 0, None), ("3", 1, 0), ("0,1", 1, 1), ("4,5", 0, 0),
])
def test_device_binding(devices, rank, expected):
    env = from_environ(srun_task(rank, CUDA_VISIBLE_DEVICES=devices))
    assert device_index(env) == expected


def test_tasks_per_node_must_match_gpus():
    env = from_environ(srun_task(0, CUDA_VISIBLE_DEVICES="0,1,2,3"))
    with pytest.raises(EnvError, match="2 tasks on this node but 4 GPUs.*HINT"):
        device_index(env)


def test_world_1_with_several_gpus_is_refused():
    env = from_environ({"CUDA_VISIBLE_DEVICES": "0,1,2"})
    with pytest.raises(EnvError, match="only GPU 0 would do any work.*HINT"):
        device_index(env)


def test_cli_json_without_torch():
    code = ("import sys, hpc.env; rc = hpc.env.main(['--json']); "
            "assert 'torch' not in sys.modules, 'torch imported'; sys.exit(rc)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=srun_task(1, PATH="/usr/bin:/bin"), timeout=60)
    assert out.returncode == 0, out.stderr
    info = json.loads(out.stdout)
    assert (info["source"], info["rank"], info["device"], info["backend"]) == ("slurm", 1, "cpu", "gloo")


def test_cli_error_exit_code():
    out = subprocess.run([sys.executable, "-m", "hpc.env"], capture_output=True, text=True,
                         env={"RANK": "1", "PATH": "/usr/bin:/bin"}, timeout=60)
    assert out.returncode == 2 and "partially set torchrun" in out.stderr
