"""The checks the local cluster makes before starting a daemon."""

import os
import socket
import subprocess
import sys
import time

import pytest

from hpc.cluster.daemons import process_alive, unix_socket_live


def test_a_socket_with_a_listener_is_live_and_a_leftover_file_is_not(tmp_path):
    # The leftover of a killed munged is a socket file nobody listens on: a configless cluster
    # removes it and starts its own munged, but uses one that answers.
    path = tmp_path / "munge.socket.2"
    assert not unix_socket_live(path)
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(str(path))
        server.listen()
        assert unix_socket_live(path)
    assert path.exists() and not unix_socket_live(path)


NO_PROC = "/nonexistent-proc"  # a /proc that shows no process: as hidepid shows another user's


def _ended_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()  # reaped: the pid names no process now
    return child.pid


def test_a_process_is_alive_until_it_ends_and_a_zombie_counts_as_ended():
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        assert process_alive(child.pid) and process_alive(os.getpid())
        child.stdin.close()
        deadline = time.monotonic() + 30
        while process_alive(child.pid) and time.monotonic() < deadline:  # ended, not yet reaped
            time.sleep(0.01)
        assert not process_alive(child.pid)
        assert child.poll() == 0  # it was a zombie until now
    finally:
        child.kill()
        child.wait()
    assert not process_alive(_ended_pid())
    assert not any(process_alive(p) for p in (0, -1, -os.getpid(), 2**31, 2**63))


def test_a_process_proc_does_not_show_is_asked_for_by_signal_0():
    assert process_alive(os.getpid(), proc=NO_PROC)
    assert not process_alive(_ended_pid(), proc=NO_PROC)


@pytest.mark.skipif(os.geteuid() != 0, reason="takes another user's identity: needs root (CI runs as root)")
def test_another_users_process_hidden_by_hidepid_counts_as_running():
    """hidepid=2 hides other users' processes from /proc; kill(pid, 0) answers EPERM for them. A
    forked child takes user nobody's identity and looks, through a /proc that shows nothing, at
    this (root's) process and at one that ended."""
    me, ended = os.getpid(), _ended_pid()
    pid = os.fork()
    if pid == 0:
        try:
            os.setgid(65534)
            os.setuid(65534)
            os._exit(0 if process_alive(me, proc=NO_PROC) and not process_alive(ended, proc=NO_PROC) else 1)
        finally:
            os._exit(2)
    assert os.waitpid(pid, 0)[1] == 0
