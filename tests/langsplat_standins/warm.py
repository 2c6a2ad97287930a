"""Run a stand-in script as `PYTHON SCRIPT ARGS...` would, forked from a warm interpreter of PYTHON.

    warm.run([env_python, "fork/train.py", "-s", ...], cwd=..., env=...)  # -> CompletedProcess

Most of a stand-in run's CPU is `import torch` (about 2.5 s on one core against 0.1 s of work), and
the tests run dozens of them. One interpreter per environment wrapper (envs/<kind> on its path, as
make_env writes it) imports numpy and torch once, then forks a child per run; the child takes the
run's argv, environment and working directory, puts the script's folder first on sys.path and runs
it as __main__, as the interpreter does: an exit code from SystemExit, a traceback and 1 for an
uncaught exception. Nothing else is imported before the fork, so each run imports the stand-ins and
its environment's diff_gaussian_rasterization itself. Stage tasks that hpc starts do not come here:
they are real processes.
"""
from __future__ import annotations

import atexit
import json
import subprocess
import tempfile
from pathlib import Path
from typing import Dict, List

# The warm interpreter: a request per line on stdin, the exit code per line on stdout.
SERVER = r'''
import json, os, runpy, sys, traceback
import numpy, torch, torch.distributed  # what the stand-ins import; nothing of the stand-ins themselves
for line in sys.stdin:
    req = json.loads(line)
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            for fd, path in ((1, req["out"]), (2, req["err"])):
                os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
            os.environ.clear()
            os.environ.update(req["env"])
            os.chdir(req["cwd"])
            sys.argv = req["argv"]
            sys.path[0] = os.path.dirname(os.path.abspath(req["argv"][0]))
            os.dup2(os.open(os.devnull, os.O_RDONLY), 0)  # the request pipe is the server's alone
            sys.stdin = open(os.devnull)
            runpy.run_path(req["argv"][0], run_name="__main__")
            code = 0
        except SystemExit as stop:
            if stop.code is None or isinstance(stop.code, int):
                code = stop.code or 0
            else:
                print(stop.code, file=sys.stderr)
        except BaseException:
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    print(os.waitstatus_to_exitcode(status), flush=True)
'''

_servers: Dict[str, subprocess.Popen] = {}


def _server(python: str, env: dict) -> subprocess.Popen:
    """One per interpreter wrapper's text: the wrappers of different tests name the same site."""
    key = Path(python).read_text() if Path(python).is_file() else python
    proc = _servers.get(key)
    if proc is None or proc.poll() is not None:
        proc = subprocess.Popen([python, "-c", SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                env=env, cwd="/")
        _servers[key] = proc
    return proc


def run(argv: List[str], cwd=None, env: dict = None) -> subprocess.CompletedProcess:
    """argv[0] the interpreter, argv[1] the script; as subprocess.run(argv, capture_output=True, text=True)."""
    import os

    env = dict(os.environ if env is None else env)
    proc = _server(str(argv[0]), env)
    with tempfile.TemporaryDirectory() as tmp:
        out, err = Path(tmp) / "out", Path(tmp) / "err"
        request = {"argv": [str(a) for a in argv[1:]], "env": env, "cwd": str(cwd or os.getcwd()),
                   "out": str(out), "err": str(err)}
        proc.stdin.write(json.dumps(request) + "\n")
        proc.stdin.flush()
        answer = proc.stdout.readline()
        if not answer:
            raise RuntimeError(f"the warm interpreter {argv[0]} died (exit {proc.wait()})")
        return subprocess.CompletedProcess(argv, int(answer), out.read_text(), err.read_text())


@atexit.register
def _close() -> None:
    for proc in _servers.values():
        proc.stdin.close()
        proc.wait(timeout=30)
