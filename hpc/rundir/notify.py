"""A run tells its user what happened, from the job side: a webhook, or a command, once per event per run.

    python -m hpc.submit run notify.webhook=https://hooks.slack.com/services/... -- python train.py

The config's `notify:` section (a profile can carry it) names the sinks: `webhook`, a URL that gets
a JSON body Slack, Mattermost and Discord accept ({"text": ..., "content": ...}, plus the event's
fields) or `template` filled in ($text, $event, $run, $task; ntfy takes a plain text one), and
`command`, an argv run with the text as its last argument. Events: a task failed (its error), a
task requeued (preemption, time limit, hang, node failure: which; hpc.recovery.submitstop where
neither hpc's loop nor a `run` stage's wrapper decided it), a hang verdict (the stuck ranks and hosts), a
time-limit cap reached (not requeued), a stage completed, the run completed. They are sent by the
job itself (rank 0 of the training loop or of a `run` stage's wrapper, the stage task for
completions and for a requeue by submitit's own signal handler or, at its next start, by SLURM
itself, the failing rank of a stage task or,
under hpc's srun wrapper, the wrapper once the job ends failed), so nothing runs on the login node;
a site whose compute nodes reach no network can have SLURM mail instead (`notify.mail`: sbatch
--mail-user and --mail-type, hpc.pipeline.sbatch.with_mail). The user's cluster file can hold a
`notify:` of its own, under each run's (hpc.config.userfile).

Each event is claimed by creating <run>/notify/<key> (O_EXCL): one message per event per run, whatever
the requeues and however many tasks see it. A process's messages are sent in order by one background
thread, each with a deadline of `timeout_s`; the process waits for them at exit no longer than that
and a second, so a sink that does not answer never fails a job; its first failure in a run is
logged, once (<run>/notify/failed-<sink>). A sweep's points send each kind of event for the first
SWEEP_LIMIT of them, then one summary pointing to hpc.status, not one message per point.
"""
from __future__ import annotations

import atexit
import contextlib
import json
import os
import queue
import string
import sys
import threading
import time
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional

from hpc.rundir import attempts
from hpc.rundir.run import RunDir
from hpc.rundir.sweepdir import is_sweep

FOLDER = "notify"
SWEEP_LIMIT = 5  # messages of one kind from a sweep's points before one summary ends them
EVENTS = ("task_failed", "requeued", "hang", "time_limit_cap", "stage_completed", "run_completed")
_sender: Dict[str, Any] = {"queue": queue.Queue(), "thread": None}  # this process's messages, in order


def settings(cfg: Mapping[str, Any]) -> Dict[str, Any]:
    """The run's notify section, {} when it names no sink."""
    found = cfg.get("notify") or {}
    return dict(found) if isinstance(found, dict) and (found.get("webhook") or found.get("command")) else {}


def claim(run: Path, key: str) -> bool:
    """Whether this process is the first to send `key` in the run (a file made once, O_EXCL)."""
    folder = Path(run) / FOLDER
    folder.mkdir(exist_ok=True)
    try:
        os.close(os.open(folder / key.replace("/", "_"), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
        return True
    except FileExistsError:
        return False


def message(event: str, run: Path, task: str, text: str) -> Dict[str, Any]:
    line = f"[hpc] {Path(run).name} {task}: {event.replace('_', ' ')}" + (f": {text}" if text else "")
    return {"text": line, "content": line, "event": event, "run": str(run), "task": task, "detail": text,
            "time": time.time()}


def _webhook(url: str, template: str, body: Mapping[str, Any], timeout_s: float) -> None:
    import urllib.request  # the standard library's, only when a message goes out: it costs a task's start 15 ms

    if template:
        data = string.Template(template).safe_substitute({k: str(v) for k, v in body.items()}).encode()
        kind = "application/json" if template.lstrip().startswith("{") else "text/plain"
    else:
        data, kind = json.dumps(body).encode(), "application/json"
    req = urllib.request.Request(url, data=data, headers={"Content-Type": kind}, method="POST")
    with urllib.request.urlopen(req, timeout=timeout_s) as answer:  # an HTTP error status raises
        answer.read()


def _command(argv: List[str], body: Mapping[str, Any], timeout_s: float) -> None:
    import subprocess  # the standard library's, only for a command sink: a task's start stays without it

    subprocess.run([*argv, body["text"]], check=True, timeout=timeout_s, capture_output=True)


def _deliver(run: Path, conf: Mapping[str, Any], body: Mapping[str, Any]) -> None:
    timeout_s = float(conf.get("timeout_s") or 3.0)
    sinks = {"webhook": lambda: _webhook(conf["webhook"], conf.get("template") or "", body, timeout_s),
             "command": lambda: _command(list(conf["command"]), body, timeout_s)}
    for name, send in sinks.items():
        if not conf.get(name):
            continue
        try:
            send()
        except Exception as err:  # any sink's failure: logged once per run, never raised
            if claim(run, f"failed-{name}"):
                print(f"[hpc] notify: the {name} sink failed ({type(err).__name__}: {err}); "
                      f"{body['event']} not delivered. Later failures of this run are not logged",
                      file=sys.stderr, flush=True)


def send(task_dir: Path, event: str, key: str, text: str = "", task: str = "") -> bool:
    """Send `event` for the run `task_dir` is in, unless its `key` was sent already in the run;
    whether it was handed to the sender. Returns at once: one background thread sends this
    process's messages, in the order they were handed to it. In a sweep, each kind of event is sent
    for its first SWEEP_LIMIT points, then once more as a summary, then not again."""
    run, cfg = attempts.run_of(task_dir)
    conf = settings(cfg)
    wanted = conf.get("events") or EVENTS
    if run is None or not conf or event not in wanted or not claim(run, f"{event}-{key}"):
        return False
    body = message(event, run, task or key, text)
    if is_sweep(str(run.parent)):
        body = _in_sweep(run, event, body)
        if body is None:
            return False
    if _sender["thread"] is None:
        _sender["thread"] = threading.Thread(target=_send_all, daemon=True, name="hpc-notify")
        _sender["thread"].start()
        atexit.register(_drain, float(conf.get("timeout_s") or 3.0) + 1.0)  # its deadline, then a second to log
    _sender["queue"].put((run, conf, body))
    return True


def _in_sweep(run: Path, event: str, body: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    """A sweep point's message: as it is for the first SWEEP_LIMIT of its kind in the sweep, the
    summary for the next one, None after that (claims in <sweep>/notify/)."""
    sweep = run.parent
    claim(sweep, f"{event}-{run.name}-{body['task']}")
    if len(list((sweep / FOLDER).glob(f"{event}-*"))) <= SWEEP_LIMIT:
        return body
    if not claim(sweep, f"more-{event}"):
        return None
    said = (f"more than {SWEEP_LIMIT} points of the sweep: not sent one by one any more. "
            f"HINT: python -m hpc.status {sweep}")
    return {**message(event, sweep, "sweep", said), "points": "more"}


def _send_all() -> None:
    while True:
        run, conf, body = _sender["queue"].get()
        try:
            _deliver(run, conf, body)
        finally:
            _sender["queue"].task_done()


def _drain(timeout_s: float) -> None:
    """At exit: give the messages in flight at most `timeout_s` together."""
    done = threading.Thread(target=_sender["queue"].join, daemon=True)
    done.start()
    done.join(timeout_s)


def wait(timeout_s: float = 5.0) -> None:
    """Wait for the messages in flight (a process that ends by os._exit skips atexit)."""
    _drain(timeout_s)


def stop(task_dir: Path, decision: Any, task: str, job: str, restart: Any) -> None:
    """A stop's decision as an event: requeued (its kind and why), or the time-limit cap reached."""
    if decision is None:
        return
    if decision.requeue:
        send(task_dir, "requeued", f"{task}-{job}-{restart}", f"{decision.kind}: {decision.why}", task)
    elif decision.kind == "timeout":
        send(task_dir, "time_limit_cap", f"{task}-{job}", decision.why, task)


HOLD_ENV = "HPC_HOLD_FAILURES"  # hpc's srun wrapper's step folder (hpc.afterstep): failures wait there for its verdict


def failed(task_dir: Path, task: str, job: str, restart: Any, text: str, rank: int = 0,
           held: Optional[str] = None) -> None:
    """A task's rank raised `text`: its sinks hear `task_failed` with it and where its log is. Under
    hpc's srun wrapper (`held`: its step's folder, HOLD_ENV) the step may be restarted in place or
    requeued: the task's first failing rank's error waits in that folder, for told_failures()."""
    run, _ = attempts.run_of(task_dir)
    if "HINT:" not in text and run is not None:
        stage, _, item = task.partition("[")
        text += (f" HINT: python -m hpc.logs {run} --stage {stage}" + (f" --task {item[:-1]}" if item else "")
                 + f" --rank {rank} --err")
    said = {"task_dir": str(task_dir), "key": f"{task}-{job}-{restart}", "text": text, "task": task}
    if not held:
        send(task_dir, "task_failed", said["key"], text, task)
        return
    name = f"failed-{task.replace('/', '_')}.json"
    with contextlib.suppress(OSError):  # the task's first failing rank's, once: O_EXCL
        with os.fdopen(os.open(Path(held) / name, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644), "w") as f:
            f.write(json.dumps(said))


def a_rank_failed(folder: str) -> bool:
    """Whether a rank of the step whose folder this is has failed (failed() wrote its error there)."""
    return bool(folder) and any(Path(folder).glob("failed-*.json"))


def told_failures(held: str) -> None:
    """In the srun wrapper, once its last step failed and the job ends so (neither restarted in place
    nor requeued): the failures its tasks' ranks held in the step's folder (failed()), sent and waited for."""
    timeout_s = 0.0
    for path in sorted(Path(held).glob("failed-*.json")):
        try:
            said = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if send(Path(said["task_dir"]), "task_failed", said["key"], said["text"], said["task"]):
            timeout_s = float(settings(attempts.run_of(Path(said["task_dir"]))[1]).get("timeout_s") or 3.0) + 1.0
    if timeout_s:
        wait(timeout_s)


def task_key(task_dir: Path) -> str:
    """A task's name from its directory: <run>/<stage>[/task-<item>] -> stage or stage[item]."""
    run, _ = attempts.run_of(task_dir)
    parts = Path(task_dir).resolve().relative_to(run.resolve()).parts if run else (Path(task_dir).name,)
    stage = parts[0] if parts else "?"
    item = parts[1][len("task-"):] if len(parts) > 1 and parts[1].startswith("task-") else None
    return stage if item is None else f"{stage}[{item}]"


def task_done(run_dir: Path, stage: str) -> None:
    """After a task's done marker: its stage completed, or the whole run, when every task of it has
    one (read only in a run that names a sink; each sent once)."""
    where = Path(run_dir) / stage
    if not settings(attempts.run_of(where)[1]):
        return
    run = RunDir(run_dir)
    done = {(t["stage"], str(t["item"])): run.is_done(t["stage"], t["item"]) for t in run.tasks()}
    later = run.unsubmitted()  # planned, not submitted yet: the local executor submits stage after stage
    if all(v for (s, _), v in done.items() if s == stage) and not any(s == stage for s, _ in later):
        send(where, "stage_completed", stage, "", stage)
    if done and all(done.values()) and not later:
        send(where, "run_completed", "run", "", "run")
