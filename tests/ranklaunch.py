"""The tests' one forking server: test processes as forks of one process that has imported torch.

    procs = ranklaunch.start([sys.executable, "tests/ddp_workload.py", ...], envs, stderr=subprocess.PIPE)
    done = ranklaunch.run([env_python, "fork/train.py", "-s", ...], cwd=..., env=...)  # a CompletedProcess

Each rank of a fresh `python tests/x_workload.py` pays `import torch` (2-3 s of CPU here), and
torch.distributed.checkpoint (sympy, through DTensor) on top, before a second of real work; the
suite starts about a hundred of them, and the LangSplat stand-in scripts dozens more. Here one
"zygote" per interpreter imports those once and forks a child per process: start()/popen() for the
ranks of a multi-process test (this interpreter), run() for a stand-in script run to its end under
an environment's interpreter wrapper (tests/langsplat_standins/checkout.py:make_env), one zygote
per wrapper's text. The child takes exactly the environment the test built for that rank
(os.environ replaced, not merged), its argv, cwd, stdin/stdout/stderr, and runs the script with
runpy as `__main__`. hpc is never imported in the zygote: it reads the environment at import and
first use, and each rank must read its own.

The handles returned act like subprocess.Popen for what the tests use (pid, poll, wait,
communicate, kill, send_signal, returncode, stderr): pid is the rank's real pid, so a signal hits
exactly that rank; the zygote reaps the ranks and reports each status on a pipe of its own.
Where a fresh interpreter and a fork differ: intra-op threads follow the rank's OMP_NUM_THREADS
(set again after the fork), or the zygote's 1 without it; variables torch reads at import (TORCH_*)
are the zygote's; the hash seed is shared.
"""

from __future__ import annotations

import atexit
import importlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

FDS = 4  # stdin, stdout, stderr, status pipe: passed with each request
RANKS = ("torch", "torch.distributed", "torch.distributed.checkpoint")  # what a rank's zygote imports
STANDINS = ("numpy", "torch", "torch.distributed")  # what the LangSplat stand-ins import
_shared: Zygote | None = None
_warm: dict[bytes, Zygote] = {}  # run(): interpreter wrapper's text -> its zygote


class Rank:
    """The Popen calls the tests make, for one forked rank; returncode is -N when signal N killed it."""

    def __init__(self, args: list[str], pid: int, status_fd: int, stderr_fd: int | None):
        self.args, self.pid, self.returncode = args, pid, None
        self._status = status_fd
        self.stderr = None if stderr_fd is None else os.fdopen(stderr_fd, "r", encoding="utf-8", errors="replace")

    def _collect(self, timeout: float | None) -> int | None:
        if self.returncode is None and select.select([self._status], [], [], timeout)[0]:
            data = os.read(self._status, 64)
            os.close(self._status)
            # no status at all: the zygote died before reaping this rank
            self.returncode = int(data) if data else -signal.SIGKILL
        return self.returncode

    def poll(self) -> int | None:
        return self._collect(0)

    def wait(self, timeout: float | None = None) -> int:
        if self._collect(timeout) is None:
            raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode

    def communicate(self, timeout: float | None = None) -> tuple[None, str | None]:
        """Read stderr to its end and wait, within `timeout` seconds for both."""
        deadline = None if timeout is None else time.monotonic() + timeout
        err = b""
        fd = None if self.stderr is None else self.stderr.fileno()
        while fd is not None:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not select.select([fd], [], [], left)[0]:
                raise subprocess.TimeoutExpired(self.args, timeout)
            chunk = os.read(fd, 1 << 16)
            err += chunk
            if not chunk:
                fd = None
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        self.wait(left)
        return None, None if self.stderr is None else err.decode("utf-8", "replace")

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:  # once reaped, the pid may belong to someone else
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)


class Zygote:
    """One forking server (a child process of this one) and the socket that asks it for ranks."""

    def __init__(self, env: dict[str, str] | None = None, python: str = sys.executable,
                 preload: tuple[str, ...] = RANKS):
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "OMP_NUM_THREADS": "1"} if env is None else env
        self._sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.proc = subprocess.Popen([str(python), __file__, str(theirs.fileno()), *preload],
                                     pass_fds=[theirs.fileno()], env=env, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL)
        theirs.close()

    def fork(self, argv: list[str], env: dict[str, str], cwd: str | Path | None = None, stdout=None,
             stderr=None, start_new_session: bool = False, stdin=None) -> Rank:
        """One rank running `argv[1:]` (argv[0], the interpreter, is the zygote's); stdin None: this
        process's, or subprocess.DEVNULL."""
        mine = []  # descriptors opened here for the rank alone: closed once the zygote holds them
        if stdin == subprocess.DEVNULL:
            mine.append(os.open(os.devnull, os.O_RDONLY))
        if stderr == subprocess.PIPE:
            err_read, err_write = os.pipe()
            mine.append(err_write)
        elif stderr == subprocess.DEVNULL:
            err_read, err_write = None, os.open(os.devnull, os.O_WRONLY)
            mine.append(err_write)
        else:
            err_read, err_write = None, 2 if stderr is None else getattr(stderr, "fileno", lambda: stderr)()
        status_read, status_write = os.pipe()
        mine.append(status_write)
        request = {"argv": [str(a) for a in argv], "env": dict(env), "cwd": str(cwd or os.getcwd()),
                   "session": start_new_session}
        out = 1 if stdout is None else getattr(stdout, "fileno", lambda: stdout)()
        fds = [mine[0] if stdin == subprocess.DEVNULL else 0, out, err_write, status_write]
        socket.send_fds(self._sock, [json.dumps(request).encode()], fds)
        reply = self._sock.recv(1 << 16)
        for fd in mine:
            os.close(fd)
        if not reply:
            raise RuntimeError("ranklaunch: the zygote died. HINT: its traceback is on this test's stderr")
        return Rank(request["argv"], json.loads(reply)["pid"], status_read, err_read)

    def close(self) -> None:
        """End the zygote once it has reaped its ended ranks, so their CPU time counts as this process's."""
        self._sock.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def popen(args: list[str], env: dict[str, str], stderr=None, text: bool = True, **kw) -> Rank:
    """subprocess.Popen([sys.executable, script, ...], env=env, ...) for a rank: forked from this
    process's zygote (started on first use). stderr, when piped, reads as text."""
    global _shared
    if args[0] != sys.executable or not text:
        raise ValueError(f"ranklaunch runs `{sys.executable} SCRIPT ...` in text mode, not {args[:2]}. "
                         "HINT: use subprocess.Popen for anything else")
    if _shared is None or _shared.proc.poll() is not None:
        _shared = Zygote()
        atexit.register(_shared.close)
    return _shared.fork(args, env, stderr=stderr, **kw)


def start(argv: list[str], envs: list[dict[str, str]], stderr=None, cwd: str | Path | None = None) -> list[Rank]:
    """One rank per environment in `envs`, each running `argv`."""
    return [popen(argv, env, stderr=stderr, cwd=cwd) for env in envs]


def run(argv: list[str], cwd: str | Path | None = None, env: dict[str, str] | None = None
        ) -> subprocess.CompletedProcess:
    """subprocess.run(argv, capture_output=True, text=True) for `PYTHON SCRIPT ARGS...`, forked from a
    zygote of PYTHON that imported STANDINS, started with the first run's environment. The wrappers
    of different tests that name the same site share one."""
    env = dict(os.environ if env is None else env)
    python = Path(argv[0])
    key = python.read_bytes() if python.is_file() else str(python).encode()
    zygote = _warm.get(key)
    if zygote is None or zygote.proc.poll() is not None:
        zygote = _warm[key] = Zygote(env, str(python), STANDINS)
        atexit.register(zygote.close)
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        code = zygote.fork([str(a) for a in argv], env, cwd, stdout=out, stderr=err, stdin=subprocess.DEVNULL).wait()
        text = [f.seek(0) or f.read().decode("utf-8", "replace") for f in (out, err)]
    return subprocess.CompletedProcess(argv, code, *text)


def _exit_code(code) -> int:
    """What the interpreter makes of SystemExit(code)."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def _run_rank(request: dict, fds: list[int], inherited: list[int], base_path: list[str]) -> None:
    """In the forked child: become the rank the request describes, run its script, never return."""
    import runpy
    import threading
    import traceback

    code = 1
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for fd in inherited:
            os.close(fd)
        for target, fd in enumerate(fds[:3]):
            os.dup2(fd, target)
        for fd in set(fds) - {0, 1, 2}:
            os.close(fd)
        if request["session"]:
            os.setsid()
        os.environ.clear()
        os.environ.update(request["env"])
        os.chdir(request["cwd"])
        script = request["argv"][1]
        sys.argv = request["argv"][1:]
        extra = [p for p in request["env"].get("PYTHONPATH", "").split(os.pathsep) if p]
        sys.path[:] = [str(Path(script).resolve().parent), *extra, *base_path]
        import torch

        if request["env"].get("OMP_NUM_THREADS", "").isdigit():  # libgomp read the zygote's at load
            torch.set_num_threads(int(request["env"]["OMP_NUM_THREADS"]))
        for hook in ("sitecustomize", "usercustomize"):  # what site.py imports at start, from the rank's path
            if hook not in sys.modules:
                try:
                    __import__(hook)
                except ImportError as missing:
                    if missing.name != hook:
                        raise
        if "numpy" in sys.modules:  # a fresh interpreter seeds numpy's global generator on its own
            sys.modules["numpy"].random.seed()
        try:
            runpy.run_path(script, run_name="__main__")
            code = 0
        except SystemExit as stop:
            code = _exit_code(stop.code)
        except BaseException:
            traceback.print_exc()
            code = 1
        # as the interpreter does at exit: join non-daemon threads, then the exit handlers, which
        # include those that torch's modules registered when the zygote imported them
        threading._shutdown()
        atexit._run_exitfuncs()
    except BaseException:
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        os._exit(code)


def serve(sock: socket.socket, preload: list[str]) -> None:
    """The zygote: fork a rank per request, reply with its pid, write its status when it ends."""
    base_path = sys.path[1:]  # without this file's folder: each rank puts its script's first
    for name in preload:  # what every rank would import; nothing here starts a thread
        importlib.import_module(name)

    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    status: dict[int, int] = {}  # pid -> write end of its status pipe
    while True:
        ready = select.select([sock, wake_read], [], [])[0]
        if wake_read in ready:
            os.read(wake_read, 4096)
            _reap(status)
        if sock in ready:
            msg, fds, _, _ = socket.recv_fds(sock, 1 << 20, FDS)
            if not msg:  # the test process is done with us
                _reap(status)
                return
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                _run_rank(json.loads(msg), fds, [sock.fileno(), wake_read, wake_write, *status.values()], base_path)
            status[pid] = fds[3]
            for fd in fds[:3]:
                os.close(fd)
            sock.send(json.dumps({"pid": pid}).encode())
            _reap(status)


def _reap(status: dict[int, int]) -> None:
    for pid in list(status):
        done, raw = os.waitpid(pid, os.WNOHANG)
        if done:
            fd = status.pop(pid)
            os.write(fd, str(os.waitstatus_to_exitcode(raw)).encode())
            os.close(fd)


if __name__ == "__main__":
    if len(sys.argv) < 2 or not sys.argv[1].isdigit():
        sys.exit("usage: python tests/ranklaunch.py FD [MODULE ...] (started by ranklaunch.start or run). "
                 "HINT: call ranklaunch.start() or ranklaunch.run() from a test instead")
    serve(socket.socket(fileno=int(sys.argv[1])), sys.argv[2:])
