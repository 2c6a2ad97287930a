import json
import re
import subprocess
import sys

import pytest
from hypothesis import given, settings, strategies as st

from hpc.runtime.devicebind import bind_device, device_index
from hpc.runtime.distenv import EnvError, master_port_for, parse_tasks_per_node, PORT_BASE, PORT_SPAN
from hpc.runtime.envparse import from_environ


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


def test_ports_differ_for_concurrent_jobs_and_array_tasks():
    assert master_port_for("1000") != master_port_for("1001")
    ports = [master_port_for(str(job)) for job in range(0, 10**6, 997)]
    assert all(PORT_BASE <= port < PORT_BASE + PORT_SPAN for port in ports)
    # array 100 task 7 and array 101 task 0 once shared a port (array_job_id*7+task); each array
    # task has its own SLURM_JOB_ID, and the port comes from it
    first = from_environ(srun_task(0, SLURM_JOB_ID="250", SLURM_ARRAY_JOB_ID="100",
                                   SLURM_ARRAY_TASK_ID="7"))
    second = from_environ(srun_task(0, SLURM_JOB_ID="101", SLURM_ARRAY_JOB_ID="101",
                                    SLURM_ARRAY_TASK_ID="0"))
    assert first.master_port == master_port_for("250")
    assert second.master_port == master_port_for("101") != first.master_port
    assert (first.array_job_id, first.array_task_id) == ("100", 7)


def test_only_hpc_master_port_overrides_the_derived_port():
    env = from_environ(srun_task(0, HPC_MASTER_PORT="31000", MASTER_PORT="31001"))
    assert env.master_port == 31000
    # MASTER_PORT in a SLURM task was inherited from the submitting shell: concurrent jobs
    # would all meet on it
    assert from_environ(srun_task(0, MASTER_PORT="31001")).master_port == master_port_for("1234")


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
    with pytest.raises(EnvError, match="SLURM_LOCALID, SLURM_TASKS_PER_NODE missing"):
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


def test_torchrun_inside_srun_wins():
    # torchrun started once per node by srun: SLURM counts nodes, torchrun counts processes.
    env = from_environ(srun_task(1, ntasks=2, RANK="5", LOCAL_RANK="1", WORLD_SIZE="8",
                                 LOCAL_WORLD_SIZE="4", MASTER_ADDR="n1", MASTER_PORT="29400",
                                 TORCHELASTIC_RUN_ID="1234"))
    assert (env.source, env.rank, env.world_size) == ("torchrun", 5, 8)


def test_inherited_torchrun_variables_lose_inside_srun():
    # sbatch exported the login shell's RANK=0 WORLD_SIZE=1: each task is still rank r of 4.
    shell = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "login",
             "MASTER_PORT": "29500"}
    envs = [from_environ(srun_task(r, **shell)) for r in range(4)]
    assert [(e.source, e.rank, e.world_size) for e in envs] == [("slurm", r, 4) for r in range(4)]
    assert {(e.master_addr, e.master_port) for e in envs} == {("n1", master_port_for("1234"))}


def test_export_round_trip_stays_slurm():
    base = srun_task(2)
    env = from_environ(base)
    target = dict(base)
    written = env.export(target)
    assert written == {"RANK": "2", "LOCAL_RANK": "0", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2",
                       "MASTER_ADDR": "n1", "MASTER_PORT": str(env.master_port)}
    assert from_environ(target) == env


def torchrun_task(rank, world, local_world, **extra):
    env = {"RANK": str(rank), "LOCAL_RANK": str(rank % local_world), "WORLD_SIZE": str(world),
           "LOCAL_WORLD_SIZE": str(local_world), "MASTER_ADDR": "h0", "MASTER_PORT": "29400",
           "TORCHELASTIC_RUN_ID": "none"}
    env.update(extra)
    return env


@pytest.mark.parametrize("devices, rank, count, expected", [
    ("", 0, None, None), ("", 0, 0, None),
    ("3", 1, None, 0), ("0,1", 1, None, 1), ("4,5", 0, None, 0), ("0,1", 1, 2, 1),
    ("0,1", 1, 0, None),  # GPUs allocated, CUDA missing (the local cluster's fake gres): CPU
])
def test_device_binding(devices, rank, count, expected):
    env = from_environ(srun_task(rank, CUDA_VISIBLE_DEVICES=devices))
    assert bind_device(env, count) == (expected, None)
    assert device_index(env, count) == expected


def test_device_from_local_rank_without_cuda_visible_devices():
    # torchrun, or a site that does not bind GPUs through gres: torch's count decides
    env = from_environ(torchrun_task(5, world=8, local_world=4))
    assert bind_device(env, device_count=4) == (1, None)
    assert bind_device(env, device_count=0) == (None, None)
    assert bind_device(env, device_count=1) == (0, None)


@pytest.mark.parametrize("env, count, words", [
    (srun_task(0, CUDA_VISIBLE_DEVICES="0,1,2,3"), None, "2 tasks on this node but 4 GPUs"),
    (torchrun_task(1, world=2, local_world=2), 8, "2 tasks on this node but 8 GPUs"),
    ({"CUDA_VISIBLE_DEVICES": "0,1,2"}, None, "world size 1 but 3 GPUs"),
    ({"CUDA_VISIBLE_DEVICES": "0,1,2"}, 0, "world size 1 but 3 GPUs"),
    ({}, 8, "world size 1 but 8 GPUs"),
])
def test_more_gpus_than_tasks_is_a_warning(env, count, words):
    # an interactive `srun --gres=gpu:8 --pty bash`, or one process spreading a model over GPUs
    parsed = from_environ(env)
    index, warning = bind_device(parsed, count)
    assert index == (None if count == 0 else parsed.local_rank)
    assert words in warning and "HINT" in warning


@pytest.mark.parametrize("env, count", [
    (srun_task(0, ntasks=8, CUDA_VISIBLE_DEVICES="0,1"), None),
    (torchrun_task(0, world=8, local_world=8), 2),
])
def test_more_tasks_than_gpus_is_refused(env, count):
    with pytest.raises(EnvError, match="4 tasks on this node but 2 GPUs|8 tasks on this node but "
                                       "2 GPUs.*HINT: use --ntasks-per-node=2"):
        bind_device(from_environ(env), count)


@pytest.mark.parametrize("extra, words", [
    ({"SLURM_PROCID": "7", "SLURM_NTASKS": "2", "SLURM_STEP_TASKS_PER_NODE": "1(x2)"},
     "SLURM_PROCID=7 with SLURM_NTASKS=2; expected a rank from 0 to 1"),
    ({"SLURM_NTASKS": "0"}, "SLURM_NTASKS=0, expected at least 1"),
    ({"SLURM_NTASKS": "-4"}, "SLURM_NTASKS=-4, expected at least 1"),
    ({"SLURM_NODEID": "5"}, "SLURM_NODEID=5 but SLURM_STEP_NODELIST has 2 hosts"),
    ({"SLURM_LOCALID": "2"}, "SLURM_LOCALID=2 with 2 tasks on this node"),
    ({"SLURM_STEP_NODELIST": "n[1-3]"}, "SLURM_STEP_NODELIST has 3 hosts, SLURM_STEP_NUM_NODES=2"),
    ({"SLURM_STEP_TASKS_PER_NODE": "2(x3)"}, "counts 3 nodes"),
    ({"SLURM_STEP_TASKS_PER_NODE": "3,2"}, "sums to 5 tasks but SLURM_NTASKS=4"),
    ({"SLURM_STEP_TASKS_PER_NODE": "2(x0)"}, "'2(x0)' not understood"),
    ({"SLURM_STEP_NODELIST": "n[1-"}, "gives the host name 'n]'"),
    ({"SLURM_STEP_NODELIST": ","}, "',' names no host"),
    ({"SLURM_STEP_NODELIST": "n[3-1]"}, "SLURM_STEP_NODELIST: invalid hostlist"),
    ({"SLURM_JOB_ID": "abc"}, "SLURM_JOB_ID='abc' is not an integer"),
])
def test_impossible_slurm_values_are_refused(extra, words):
    with pytest.raises(EnvError, match="HINT") as info:
        from_environ(srun_task(3, **extra))
    assert words in str(info.value)


@pytest.mark.parametrize("text", ["4_0", " 4", "4 ", "+4", "4.0", "٤", "４", "1" * 30, ""])
def test_integers_are_ascii_digits_only(text):
    # int() would take most of these: 4_0 as 40, unicode digits, surrounding spaces
    env = srun_task(0, SLURM_NTASKS=text)
    if not text:
        with pytest.raises(EnvError, match="SLURM_NTASKS missing"):
            from_environ(env)
        return
    with pytest.raises(EnvError, match=re.escape(f"SLURM_NTASKS={text!r} is not an integer")):
        from_environ(env)


@pytest.mark.parametrize("env, words", [
    ({**torchrun_task(0, world=1, local_world=1), "WORLD_SIZE": "0"},
     "WORLD_SIZE=0, expected at least 1"),
    (torchrun_task(7, world=2, local_world=2), "RANK=7 with WORLD_SIZE=2"),
    (torchrun_task(1, world=2, local_world=4), "LOCAL_WORLD_SIZE=4 with WORLD_SIZE=2"),
    (torchrun_task(3, world=4, local_world=2, GROUP_RANK="2"), "GROUP_RANK=2 with 2 nodes"),
])
def test_impossible_torchrun_values_are_refused(env, words):
    with pytest.raises(EnvError, match="HINT") as info:
        from_environ(env)
    assert words in str(info.value)


def test_cli_json_without_torch():
    code = ("import sys, hpc.env; rc = hpc.env.main(['--json']); "
            "assert 'torch' not in sys.modules, 'torch imported'; sys.exit(rc)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=srun_task(1, PATH="/usr/bin:/bin"), timeout=60)
    assert out.returncode == 0, out.stderr
    info = json.loads(out.stdout)
    assert (info["source"], info["rank"], info["device"], info["backend"]) == ("slurm", 1, "cpu", "gloo")


@pytest.mark.parametrize("env", [
    {"RANK": "1"},
    srun_task(0, SLURM_STEP_NODELIST="n[1-"),
    srun_task(0, SLURM_STEP_NODELIST=","),
    srun_task(0, SLURM_JOB_ID="abc"),
    srun_task(0, SLURM_STEP_TASKS_PER_NODE="2(x0)"),
    {**torchrun_task(0, world=1, local_world=1), "WORLD_SIZE": "0"},
    srun_task(0, ntasks=8, CUDA_VISIBLE_DEVICES="0,1"),
])
def test_cli_errors_are_one_line_with_a_hint(env):
    out = subprocess.run([sys.executable, "-m", "hpc.env"], capture_output=True, text=True,
                         env={**env, "PATH": "/usr/bin:/bin"}, timeout=60)
    assert out.returncode == 2 and not out.stdout
    assert out.stderr.count("\n") == 1 and out.stderr.startswith("hpc.env: ")
    assert "HINT" in out.stderr


def test_cli_warns_on_more_gpus_than_tasks():
    out = subprocess.run([sys.executable, "-m", "hpc.env"], capture_output=True, text=True,
                         env={"CUDA_VISIBLE_DEVICES": "0,1", "PATH": "/usr/bin:/bin"}, timeout=60)
    assert out.returncode == 0 and "warning: world size 1 but 2 GPUs" in out.stderr
    assert "cuda:0" in out.stdout


# -- fuzzing: garbage in any variable gives a coherent DistEnv or an EnvError, nothing else ---

VARIABLES = sorted({*srun_task(0), "SLURM_NODELIST", "SLURM_NNODES", "SLURM_ARRAY_JOB_ID",
                    "SLURM_ARRAY_TASK_ID", "SLURM_RESTART_COUNT", "SLURM_NPROCS",
                    "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_RUN_ID", "RANK", "LOCAL_RANK",
                    "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
                    "MASTER_ADDR", "MASTER_PORT", "HPC_MASTER_PORT", "HPC_MASTER_ADDR",
                    "CUDA_VISIBLE_DEVICES"})
VALUE = st.one_of(
    st.integers(-3, 12).map(str),
    st.sampled_from(["", "0", "65536", "29400", "4_0", "٣", " 2", "n[1-2]", "n[1-", ",", "2(x2)",
                     "2(x0)", "3,1", "1(x4)", "0,1", "batch", "99999999999999999999999"]),
    st.text(alphabet="0123456789[](x),- n_", max_size=8),
    st.text(max_size=6),
)
BASES = st.sampled_from([{}, srun_task(1), srun_task(3, ntasks=8, nodes=2),
                         torchrun_task(5, world=8, local_world=4)])


def assert_coherent(d):
    assert d.source in {"slurm", "torchrun", "single"}
    assert 0 <= d.rank < d.world_size and 0 <= d.local_rank < d.local_world_size <= d.world_size
    assert 0 <= d.node_rank < d.num_nodes <= d.world_size
    assert 1024 <= d.master_port <= 65535 and d.master_addr
    assert d.restart_count >= 0 and (d.array_task_id is None or d.array_task_id >= 0)
    assert not d.hosts or (d.source != "slurm" or len(d.hosts) == d.num_nodes)
    assert d.job_id is None or d.job_id.isdigit()


@settings(max_examples=300, deadline=None)
@given(base=BASES, changes=st.dictionaries(st.sampled_from(VARIABLES), VALUE, max_size=6),
       count=st.one_of(st.none(), st.integers(0, 9)))
def test_fuzz_environment_gives_coherent_env_or_env_error(base, changes, count):
    env = {k: v for k, v in {**base, **changes}.items() if "\0" not in v}
    try:
        parsed = from_environ(env)
    except EnvError as err:
        assert "\n" not in str(err) and "HINT" in str(err)
        return
    assert_coherent(parsed)
    try:
        index, _ = bind_device(parsed, count)
    except EnvError as err:
        assert "HINT" in str(err)
        return
    assert index is None or 0 <= index < max(count or 0, len(parsed.visible_devices))
