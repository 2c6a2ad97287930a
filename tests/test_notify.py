"""Notifications from the job side (hpc.rundir.notify): a real HTTP server on 127.0.0.1 gets the webhooks
of a run on the local executor, one per event, and a sink that is down or hangs never fails or holds
a job longer than its deadline. The requeue of a preempted run on the cluster is
tests/slurm/test_goodput_cluster.py's.

    python -m pytest tests/test_notify.py -q
"""
import http.server
import json
import threading
import time
from pathlib import Path

import pytest

import hpc
from hpc.rundir import notify
from hpc.rundir.run import RunDir


class Hook:
    """An HTTP server on 127.0.0.1 that keeps every JSON body POSTed to it (`delay_s`: it answers that late)."""

    def __init__(self, delay_s: float = 0.0):
        self.bodies, self.delay_s = [], delay_s
        hook = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                time.sleep(hook.delay_s)
                hook.bodies.append(json.loads(body))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def events(self):
        return [(b["event"], b["task"]) for b in self.bodies]

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def tiny(monkeypatch):
    monkeypatch.chdir(Path(__file__).resolve().parents[1])  # the jobs import tests.tiny_pipeline from here


def submit(tmp_path, url, *more):
    return hpc.submit("tests.tiny_pipeline", cluster="local", run_dir=tmp_path / "run",
                      overrides=["tiny.parts=[0,1]", f"notify.webhook={url}", "notify.timeout_s=2", *more])


def test_a_run_sends_one_message_per_event(tmp_path, tiny):
    hook = Hook()
    try:
        run = submit(tmp_path, hook.url, "tiny.fail_items=[1]")
        assert [r["state"] for r in run.status()] == ["COMPLETED", "COMPLETED", "FAILED"]
        assert hook.events() == [("stage_completed", "first"), ("task_failed", "second[1]")]
        failed = hook.bodies[1]
        assert "second: item 1 failing on request" in failed["text"] and failed["text"] == failed["content"]
        # the failed task again, now passing: its stage and the run complete, each told once
        submit(tmp_path, hook.url, "tiny.fail_items=[]")
        assert hook.events()[2:] == [("stage_completed", "second"), ("run_completed", "run")]
        assert not notify.send(run.path / "second", "run_completed", "run")  # claimed on disk already
    finally:
        hook.close()


def test_a_sink_that_is_down_or_hangs_fails_no_job_and_is_logged_once(tmp_path, tiny):
    hook = Hook(delay_s=30)  # answers long after the deadline
    try:
        t0 = time.monotonic()
        run = submit(tmp_path, hook.url)
        took = time.monotonic() - t0
    finally:
        hook.close()
    assert run.done() and took < 25, took  # the sink answers after 30 s: no job waited for it
    logs = "".join(p.read_text() for p in RunDir(run.path).path.glob("*/logs/**/*_log.err"))
    assert logs.count("[hpc] notify: the webhook sink failed") == 1, logs
    down = hpc.submit("tests.tiny_pipeline", cluster="local", run_dir=tmp_path / "down",
                      overrides=["tiny.parts=[0]", "notify.webhook=http://127.0.0.1:9/nothing"])
    assert down.done()
    logs = "".join(p.read_text() for p in down.path.glob("*/logs/**/*_log.err"))
    assert logs.count("[hpc] notify: the webhook sink failed") == 1 and "URLError" in logs, logs


def test_a_template_and_a_command_sink(tmp_path):
    run = tmp_path / "run"
    (run / "train").mkdir(parents=True)
    (run / "manifest.json").write_text("{}")
    out = tmp_path / "said.txt"
    (run / "config.yaml").write_text(json.dumps({"notify": {
        "command": ["sh", "-c", f'printf "%s\\n" "$0" >> {out}'], "events": ["requeued"]}}))
    assert not notify.send(run / "train", "task_failed", "k1", "boom")  # not among the events asked for
    assert notify.send(run / "train", "requeued", "k2", "preempt: requeued", "train")
    notify.wait()
    assert out.read_text() == f"[hpc] {run.name} train: requeued: preempt: requeued\n"


def test_a_failure_under_the_srun_wrapper_waits_for_the_jobs_end(tmp_path):
    """A step's failure may be restarted in place, then pass: its ranks' errors are held beside the
    step's stop request (the first rank's kept), and only the wrapper, once the job ends failed, sends
    it (tests/slurm/test_pipeline.py::test_a_failing_rank_ends_its_task_at_once on the cluster)."""
    hook = Hook()
    run = tmp_path / "run"
    (run / "second" / "task-0").mkdir(parents=True)
    (run / "manifest.json").write_text("{}")
    (run / "config.yaml").write_text(json.dumps({"notify": {"webhook": hook.url}}))
    steps = [run / ".host" / f"7-0{k}" for k in ("", ".1")]
    try:
        for step in steps:
            step.mkdir(parents=True)
            for rank in (1, 0):
                notify.failed(run / "second" / "task-0", "second[0]", "7", 0, f"RuntimeError: rank {rank}", rank,
                              str(step))
        notify.wait()
        assert hook.bodies == []  # the restart in place could have passed: nothing said yet
        notify.told_failures(str(steps[-1]))
        notify.told_failures(str(steps[-1]))
    finally:
        hook.close()
    assert hook.events() == [("task_failed", "second[0]")]
    assert hook.bodies[0]["detail"] == f"RuntimeError: rank 1 HINT: python -m hpc.logs {run} --stage second --task 0 " \
                                       "--rank 1 --err"


def test_a_hang_verdict_names_the_stuck_rank(tmp_path):
    """Two ranks of hpc's loop, rank 1 stopped after step 3 (tests/test_watchdog.py's run): rank 0's
    watchdog ends its process only after the run's webhook has the verdict."""
    from tests.hang_workload import launch

    hook = Hook()
    run = tmp_path / "run"
    (run / "train").mkdir(parents=True)
    (run / "manifest.json").write_text("{}")
    (run / "config.yaml").write_text(json.dumps({"notify": {"webhook": hook.url}}))
    procs = launch("stall", 2, run / "train", {"watchdog_s": 2, "stop_rank": 1, "stop_at": 3, "steps": 50,
                                                "timeout_s": 600})
    try:
        assert procs[0].wait(timeout=120) == 1
    finally:
        procs[1].kill()
        procs[1].wait()
        hook.close()
    assert hook.events() == [("hang", "train")]
    assert "rank 1" in hook.bodies[0]["detail"] and hook.bodies[0]["detail"].endswith("; not requeued")


def test_a_sweep_sends_a_few_messages_of_a_kind_then_one_summary(tmp_path, tiny):
    hook = Hook()
    try:
        sweep = hpc.submit("tests.tiny_pipeline", cluster="local", run_dir=tmp_path / "sweep",
                           overrides=["tiny.parts=[0]", "tiny.fail_items=[0]", f"notify.webhook={hook.url}",
                                      "notify.events=[task_failed]"],
                           sweep=["tiny.score=1,2,3,4,5,6,7"])
        assert [p["state"] for p in sweep.status()] == ["FAILED"] * 7
    finally:
        hook.close()
    events = hook.events()
    assert events[:-1] == [("task_failed", "second[0]")] * notify.SWEEP_LIMIT, events  # 7 failed: 5, then one summary
    assert events[-1] == ("task_failed", "sweep"), events
    last = hook.bodies[-1]["text"]
    assert "more than 5 points of the sweep" in last and "HINT: python -m hpc.status" in last


@pytest.mark.parametrize("override, said", [
    ("notify.mail_type=[END,SOMETIMES]", "notify.mail_type=['END', 'SOMETIMES']: SOMETIMES for SLURM's mail"),
    ("notify.events=[hang]", "notify.events=['hang']: nothing for SLURM's mail"),
    ("notify.mail=me@site.org;rm", "notify.mail='me@site.org;rm'; expected an address"),
])
def test_slurm_mail_that_sbatch_cannot_take_is_refused_in_one_line(override, said):
    """notify.mail's sbatch lines are tests/test_plan.py's golden run_sandbox_mail."""
    from tests.test_plan import dry_run

    out = dry_run(["run", "--cluster", "slurm", "--profile", "sandbox", "notify.mail=me@site.org", override,
                   "--", "python", "train.py"])
    assert out.returncode == 2 and said in out.stderr and "HINT: notify." in out.stderr, out.stderr
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr


def test_the_users_cluster_file_names_the_sinks_and_a_runs_own_notify_wins(tmp_path, tiny, monkeypatch):
    """A top-level notify: in the user's cluster file (HPC_CLUSTERS_FILE) reaches every run submitted
    from here, under the run's own: here its events come from the command line, its webhook from the file."""
    hook = Hook()
    mine = tmp_path / "clusters.yaml"
    mine.write_text(f"notify:\n  webhook: {hook.url}\n  events: [task_failed]\n  timeout_s: 2\n"
                    "far:\n  ssh: alice@far.example.org\n")
    monkeypatch.setenv("HPC_CLUSTERS_FILE", str(mine))
    try:
        run = hpc.submit("tests.tiny_pipeline", cluster="local", run_dir=tmp_path / "run",
                         overrides=["tiny.parts=[0]", "notify.events=[stage_completed,run_completed]"])
        assert run.done()
    finally:
        hook.close()
    assert hook.events() == [("stage_completed", "first"), ("stage_completed", "second"), ("run_completed", "run")]
    saved = (run.path / "config.yaml").read_text()
    assert hook.url in saved  # the run keeps what it was submitted with: a resubmission reads its saved config


@pytest.mark.parametrize("text, said", [
    ("notify: [a]\n", "(notify:): a list; expected a mapping of a run's notify keys"),
    ("notify:\n  webhok: http://x\n", "webhok"),
])
def test_a_users_notify_that_is_no_notify_section_is_refused_in_one_line(tmp_path, monkeypatch, text, said):
    from tests.test_plan import dry_run

    (tmp_path / "clusters.yaml").write_text(text)
    monkeypatch.setenv("HPC_CLUSTERS_FILE", str(tmp_path / "clusters.yaml"))
    out = dry_run(["tests.tiny_pipeline", "--cluster", "local"], run_dir=str(tmp_path / "run"))
    assert out.returncode == 2 and said in out.stderr and "HINT:" in out.stderr, out.stderr
    assert str(tmp_path / "clusters.yaml") in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr


def test_a_named_clusters_notify_goes_with_a_submission_to_it(tmp_path, monkeypatch):
    """The entry's notify: over the file's top-level one, both before the command's own key=value
    overrides, in the command the cluster runs (its dry run prints it; `ssh: local` needs no ssh)."""
    from tests.test_plan import dry_run

    (tmp_path / "clusters.yaml").write_text(
        "notify:\n  webhook: http://hooks.example.org/me\n  events: [task_failed]\n"
        f"far:\n  ssh: local\n  runs: {tmp_path / 'runs'}\n  notify:\n    mail: alice@far.example.org\n"
        "    events: [run_completed]\n")
    monkeypatch.setenv("HPC_CLUSTERS_FILE", str(tmp_path / "clusters.yaml"))
    out = dry_run(["tests.tiny_pipeline", "--cluster", "far", "notify.timeout_s=5"], run_dir="r")
    assert out.returncode == 0, out.stderr
    said = out.stdout.replace("'\"'\"'", "")
    order = ['notify.webhook="http://hooks.example.org/me"', 'notify.events=["run_completed"]',
             'notify.mail="alice@far.example.org"', "notify.timeout_s=5"]
    assert all(o in said for o in order) and sorted(order, key=said.index) == order, said
    assert "task_failed" not in said


def test_a_requeue_by_submitits_own_handler_is_told_once_per_attempt(tmp_path, tiny):
    """A stage without hpc's loop (tiny's first sleeps) gets the time-limit signal 5 s in (a 1-minute
    limit, the signal 55 s before it): submitit's handler checkpoints and requeues it, three times
    (submitit's timeouts), then gives up; each requeue and the failure reach the webhook once."""
    hook = Hook()
    try:
        run = hpc.submit("tests.tiny_pipeline", cluster="local", run_dir=tmp_path / "run",
                         overrides=["tiny.parts=[0]", "tiny.sleep_s=60", "stages.first.time_min=1",
                                    "stages.first.signal_delay_s=55", f"notify.webhook={hook.url}"])
    finally:
        hook.close()
    assert run.status()[0]["state"] == "FAILED"
    assert hook.events() == [("requeued", "first")] * 3 + [("task_failed", "first")], hook.events()
    for body, left in zip(hook.bodies[:3], (2, 1, 0)):  # the signal 55 s before the limit: the time limit's
        assert body["detail"].startswith("timeout: submitit: time limit near (") and \
            body["detail"].endswith(f"the signal due 55 s before it), requeued ({left} timeouts left)"), body
    assert "timed-out too many times" in hook.bodies[3]["detail"]


@pytest.mark.parametrize("info, started, said", [
    # a site with PreemptParameters=send_user_signal: the time-limit signal at a preemption, SLURM's PreemptTime set
    ({"JobState": "RUNNING", "PreemptTime": "2026-11-28T10:00:00", "EndTime": "2026-11-28T10:00:30"}, 0.0,
     ("preempt", "SLURM JobState=RUNNING, PreemptTime=2026-11-28T10:00:00")),
    # no scontrol (a container): the signal 50 min before the 1-hour limit is not the time limit's, due 120 s before
    (None, 1000.0 - 600, ("preempt", "preempted: the signal came 3000 s before the time limit")),
    (None, 1000.0 - 3480, ("timeout", "time limit near (120 s left, the signal due 120 s before it)")),
])
def test_a_stop_signal_is_told_apart_by_slurms_preempt_time_or_its_timing(info, started, said):
    """What hpc.recovery.submitstop says of the signal submitit's handler caught, where the sandbox's
    SLURM cannot send it so (tests/slurm/test_requeue_kinds.py has the real time limit and preemption)."""
    from hpc.recovery import submitstop

    ask = (lambda *a, **k: dict(info)) if info else (lambda *a, **k: (_ for _ in ()).throw(RuntimeError("no scontrol")))
    kind, why = submitstop.at_signal("42", 3600, 120, started, now=1000.0, ask=ask)
    assert kind == said[0] and why.startswith(said[1]), why


def test_an_array_tasks_previous_attempt_is_asked_of_slurm_as_its_array_task(tmp_path, monkeypatch):
    """The task holding an array's own record has SLURM_JOB_ID == SLURM_ARRAY_JOB_ID; sacct and scontrol
    asked for that id answer for the whole array, so the previous attempt is asked for as J_T."""
    import submitit

    from hpc.recovery import submitstop

    run = tmp_path / "run"
    (run / "first" / "task-1").mkdir(parents=True)
    (run / "config.yaml").write_text("notify:\n  webhook: http://127.0.0.1:9/\nstages: {}\n")
    (run / "manifest.json").write_text("{}")
    asked = []
    monkeypatch.setattr(submitstop, "previous", lambda job, restart: asked.append(job) or ("preempt", "said"))
    monkeypatch.setattr(submitstop.notify, "send", lambda *a, **k: None)
    for key, value in {"SUBMITIT_EXECUTOR": "slurm", "SLURM_JOB_ID": "40", "SLURM_ARRAY_JOB_ID": "40",
                       "SLURM_ARRAY_TASK_ID": "1"}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(type(submitit.JobEnvironment()), "_requeue", lambda self, countdown: None)
    submitstop.on_submitit_requeue(run / "first" / "task-1", "first[1]", "40", 1)
    assert asked == ["40_1"]
