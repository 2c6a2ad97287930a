"""The daemons a local cluster runs, and the command line each is started with.

munged (unless the host's serves the default socket), MariaDB and slurmdbd where the cluster keeps
accounting, slurmctld, then one slurmd per node. Programs are looked up on PATH and in the sbin
directories a login shell may leave out.
"""

from __future__ import annotations

import os
import shlex
import shutil
from typing import Callable

from hpc.cluster import layout as L
from hpc.cluster.daemons import Daemon, port_open

REQUIRED = ["munged", "mariadbd", "mariadb-install-db", "mariadb", "slurmdbd", "slurmctld", "slurmd",
            "sacctmgr", "sbatch", "scontrol", "sinfo", "unshare", "mount", "bwrap"]
SBIN = ["/usr/sbin", "/sbin", "/usr/bin", "/bin"]


def find_binary(name: str) -> str | None:
    path = os.environ.get("PATH", "") + os.pathsep + os.pathsep.join(SBIN)
    return shutil.which(name, path=path)


def missing_binaries() -> list[str]:
    return [b for b in REQUIRED if find_binary(b) is None]


def own_munged(c: L.ClusterLayout) -> Daemon:
    """The munged this cluster starts itself, with its own key."""
    return Daemon("munged", [find_binary("munged") or "munged", "-F", "--force", f"--socket={c.munge_socket}",
                             f"--key-file={c.path('munge', 'munge.key')}",
                             f"--pid-file={c.path('munge', 'munged.pid')}",
                             f"--seed-file={c.path('munge', 'munged.seed')}",
                             f"--log-file={c.path('log', 'munged.log')}"],
                  c, ready=lambda: c.munge_socket.exists())


def mariadbd(c: L.ClusterLayout) -> Daemon:
    return Daemon("mariadbd", [find_binary("mariadbd") or "mariadbd", "--no-defaults", "--user=root",
                               f"--datadir={c.path('db', 'data')}", f"--tmpdir={c.path('db', 'tmp')}",
                               f"--socket={c.mysql_socket}",
                               f"--port={c.mysql_port}", "--bind-address=127.0.0.1",
                               f"--pid-file={c.path('db', 'mysqld.pid')}", "--skip-name-resolve",
                               f"--log-error={c.path('log', 'mariadb.log')}",
                               "--innodb-buffer-pool-size=32M"],
                  c, ready=lambda: c.mysql_socket.exists() and port_open(c.mysql_port), start_timeout_s=60)


def slurmd_argv(c: L.ClusterLayout, node: str) -> list[str]:
    slurmd = [find_binary("slurmd") or "slurmd", "-D", "-N", node]
    if not c.configless:
        return slurmd
    # A configless slurmd links /run/slurm/conf to its cached config, and clients on that host
    # read it. A private mount namespace keeps that link on the node: this host also plays the
    # login node, whose clients must find the controller without any file.
    private = c.spool / node / "run-slurm"
    script = (f"mkdir -p {L.RUN_CONF} && mount --bind {shlex.quote(str(private))} {L.RUN_CONF} && "
              f"exec {shlex.join(slurmd + ['--conf-server', c.conf_server])}")
    return [find_binary("unshare") or "unshare", "--mount", "--propagation", "private", "sh", "-c", script]


def cluster_daemons(c: L.ClusterLayout, *, with_munged: bool, controller_up: Callable[[], bool]) -> list[Daemon]:
    """Every daemon of the cluster, in start order; `controller_up` tells when slurmctld answers."""
    daemons = [own_munged(c)] if with_munged else []
    if c.accounting:
        daemons += [mariadbd(c), Daemon("slurmdbd", [find_binary("slurmdbd") or "slurmdbd", "-D"], c,
                                        ready=lambda: port_open(c.dbd_port))]
    daemons.append(Daemon("slurmctld", [find_binary("slurmctld") or "slurmctld", "-D", "-i"], c,
                          ready=controller_up))
    for i, node in enumerate(c.node_names):
        port = c.node_port(i)
        daemons.append(Daemon(f"slurmd-{node}", slurmd_argv(c, node), c,
                              ready=lambda port=port: port_open(port), program="slurmd"))
    return daemons
