"""Restarts in place, the pure part: which failure restarts, on which nodes, and the srun line.

    python -m pytest tests/test_inplace.py -q

The cluster's side (a rank killed or hung, a failed node with and without a spare) is
tests/slurm/test_restart_in_place.py's.
"""
from hpc.recovery import inplace, restart
from hpc.recovery.hangs import attempt_dir


def crash(mark):
    return inplace.Failure("crash", mark, mark)


def earlier(kind, step, progress):
    return {"kind": inplace.KIND, "failure": kind, "step": step, "progress": progress}


def test_a_first_failure_restarts_and_a_repeat_or_no_progress_falls_back():
    assert inplace.decide(crash(3), [], 3, 600, 20)[0]
    assert inplace.decide(crash(5), [earlier("crash", 3, 3)], 3, 600, 20)[0]  # progress since
    ok, why = inplace.decide(crash(3), [earlier("crash", 3, 3)], 3, 600, 20)
    assert not ok and "again" in why
    ok, why = inplace.decide(inplace.Failure("hang", 4, 3), [earlier("crash", 3, 3)], 3, 600, 20)
    assert not ok and "no checkpoint newer than checkpoint step-3" in why
    ok, why = inplace.decide(crash(None), [earlier("crash", None, None)], 3, 600, 20)
    assert not ok  # before any checkpoint, twice: no progress


def test_the_count_and_the_time_left_bound_restarts():
    ok, why = inplace.decide(crash(9), [earlier("crash", k, k) for k in (1, 2, 3)], 3, 600, 20)
    assert not ok and "max_restarts_in_place=3" in why
    ok, why = inplace.decide(crash(3), [], 3, 15, 20)
    assert not ok and "15 s left" in why
    assert inplace.decide(crash(3), [], 3, None, 20)[0]  # EndTime unknown: the count bounds it
    assert not inplace.decide(crash(3), [], 0, 600, 20)[0]  # 0: off


def test_a_spare_replaces_a_failed_node_and_a_range_shrinks():
    assert inplace.nodes_for(["n1", "n2", "n3"], ["n1"], 2, 2) == ["n2", "n3"]
    assert inplace.nodes_for(["n1", "n2"], ["n2"], 2, 1) == ["n1"]  # nodes=1-2: on the one left
    assert inplace.nodes_for(["n1", "n2"], ["n2"], 2, 2) is None  # too few: a requeue without it


def test_the_next_step_appends_to_its_logs_and_names_its_nodes():
    assert inplace.srun_args(None, 2) == ["--open-mode=append"]
    assert inplace.srun_args(["n2", "n3"], 4) == ["--open-mode=append", "--nodes=2", "--ntasks=8",
                                                  "--nodelist=n2,n3"]


def test_spare_nodes_leave_the_first_step_on_the_others():
    state = {}
    env = {"HPC_SPARE_NODES": "1", "HPC_NODES": "2", "SLURM_NTASKS_PER_NODE": "4", "SLURM_JOB_NODELIST": "n[1-3]"}
    argv = restart.first(["srun", "--unbuffered", "python", "x"], env, state)
    # the first node, which runs the batch script and its wrapper, is the spare
    assert argv == ["srun", "--nodes=2", "--ntasks=8", "--nodelist=n2,n3", "--unbuffered", "python", "x"]
    assert state["training"] == ["n2", "n3"]
    assert restart.first(["srun", "x"], env, {}, usable=["n1", "n2"]) == ["srun", "--nodes=2", "--ntasks=8",
                                                                          "--nodelist=n1,n2", "x"]
    assert restart.first(["srun", "x"], {**env, "HPC_SPARE_NODES": "0"}, {}) == ["srun", "x"]


def test_a_restarted_step_has_a_hang_folder_of_its_own(tmp_path):
    assert attempt_dir(tmp_path, 7, 0, {}).name == "7.0"
    assert attempt_dir(tmp_path, 7, 0, {inplace.ENV: "2"}).name == "7.0.2"


def test_status_and_the_timeline_show_each_restart(tmp_path):
    import json

    from hpc.monitor import timeline
    from hpc.recovery import nodefail

    event = {"time": 1000.0, "job": "7", "restart": 0, "kind": inplace.KIND, "failure": "crash", "do": "restart",
             "why": "a rank crashed or hit a collective timeout: restart in place 1 of at most 3, from checkpoint "
                    "step-3", "done": "restarted in place as step 1 of job 7"}
    restart.record(tmp_path, nodefail.load(tmp_path), event)
    assert json.loads((tmp_path / nodefail.HISTORY).read_text())["restarts_in_place"] == 1
    assert nodefail.summary(tmp_path) == f"1 restart(s) in place; last: {event['why']} ({event['done']})"
    bar = timeline.Segment(900.0, 1100.0, "COMPLETED", "2 ranks", "attempt-train-7-1")
    (mark,) = timeline.in_place(tmp_path, [bar])
    assert (mark.kind, mark.start, mark.gid) == ("RESTARTED", 1000.0, "")


def test_no_restart_in_place_once_the_time_limits_signal_has_come():
    assert inplace.decide(crash(3), [], 3, 600, 20, warned_s=120)[0]
    assert inplace.decide(crash(3), [], 3, 140, 20)[0]  # not told the stage's signal_delay_s
    ok, why = inplace.decide(crash(3), [], 3, 140, 20, warned_s=120)  # submitit's handler failed the rank at the signal
    assert not ok and "time-limit signal" in why, why
    assert inplace.warned({"HPC_SIGNAL_DELAY_S": "120"}) == 120 and inplace.warned({}) == 0



def test_a_repeated_failure_before_any_checkpoint_is_said_so():
    ok, why = inplace.decide(inplace.Failure("error", None, None), [earlier("error", None, None)], 3, 600, 20)
    assert not ok and why == "a rank exited with an error before any checkpoint again, as before the last restart in place"


def test_a_requeued_spare_stage_asks_for_its_spares_again():
    from hpc.recovery import requeue

    env = {"HPC_NODES": "1-2", "SLURM_NTASKS_PER_NODE": "2", "HPC_SPARE_NODES": "1"}
    assert requeue.restored(env, ["n3"]) == {"NumNodes": "2-3", "NumTasks": "4", "ExcNodeList": "n3"}
    assert requeue.restored({**env, "HPC_SPARE_NODES": "0"}) == {"NumNodes": "1-2", "NumTasks": "2"}
    assert requeue.restored({**env, "HPC_NODES": "1"}) == {}  # sbatch's own count: SLURM keeps it
    assert requeue.adding({"ExcNodeList": "n[1-2]"}, ["n4"]) == ["n1", "n2", "n4"]
    assert requeue.adding({"ExcNodeList": "n1"}, []) == []  # nothing to add: the list is left as it is


def test_a_node_lost_in_an_earlier_step_stays_out_once_back_in_service(tmp_path):
    env = {"SLURM_JOB_NODELIST": "n[1-3]", "HPC_NODES": "1", "SLURM_NTASKS_PER_NODE": "2", "HPC_SPARE_NODES": "2",
           "SLURM_JOB_ID": "7"}
    state = {"number": 1, "argv": ["srun", "x"], "started": 0.0, "request": str(tmp_path / "request.json"),
             "training": ["n2"], "lost": ["n1"]}  # n1 failed in the first step; SLURM shows it healthy again
    ok, why = restart.offer(state, None, {}, ["n2"], {"JobState": "RUNNING"}, env, "7")
    assert ok, why
    assert state["next"] == ["srun", "--open-mode=append", "--nodes=1", "--ntasks=2", "--nodelist=n3", "x"]
    assert state["lost"] == ["n1", "n2"]


def test_a_step_left_on_a_lost_node_is_looked_for_only_after_a_while_and_overlapped_after(tmp_path):
    state = {"argv": ["srun", "x"]}
    assert not restart.lost(state, {}, now=100.0) and state["failing_since"] == 100.0  # srun ends by itself, mostly
    assert not restart.lost(state, {}, now=100.0 + restart.LOST_AFTER_S - 1)  # SLURM not asked yet
    env = {"HPC_NODES": "1", "SLURM_NTASKS_PER_NODE": "2"}
    assert restart.next_line(state, ["n1"], env) == ["srun", "--open-mode=append", "--nodes=1", "--ntasks=2",
                                                     "--nodelist=n1", "x"]
    state["overlap"] = True  # set by lost() once a node was found gone: its step holds CPUs on the others
    assert restart.next_line(state, ["n1"], env)[-2:] == ["--overlap", "x"]
