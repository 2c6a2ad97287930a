"""The accounting database of a local cluster: MariaDB's data directory, the `slurm` user slurmdbd
logs in as, and the cluster's entry in slurmdbd.

Each step is idempotent, so `up()` can run them again on a cluster that was stopped.
"""

from __future__ import annotations

import os
import pwd
import subprocess
import time
from typing import Callable

from hpc.cluster import layout as L
from hpc.cluster.daemons import ClusterError
from hpc.cluster.daemonset import find_binary

Run = Callable[..., subprocess.CompletedProcess]
ACCOUNT = "hpc"  # the account of the user's association on a cluster with limits


def init_db(c: L.ClusterLayout, env: dict[str, str]) -> None:
    """Create MariaDB's system tables, once per cluster directory."""
    data = c.path("db", "data")
    # MariaDB's own temporary tables go here, not to the shared /tmp, where two clusters coming up
    # at once (test workers) have made each other's bootstrap fail
    c.path("db", "tmp").mkdir(parents=True, exist_ok=True)
    if (data / "mysql").exists():
        return
    out = subprocess.run([find_binary("mariadb-install-db") or "mariadb-install-db", "--no-defaults",
                          "--user=root", f"--datadir={data}", "--auth-root-authentication-method=socket",
                          "--skip-test-db", f"--tmpdir={c.path('db', 'tmp')}"], env=env, capture_output=True, text=True)
    if out.returncode:
        raise ClusterError(f"mariadb-install-db failed: {out.stderr[-2000:]}\nHINT: remove {data} and retry.")


def mysql(c: L.ClusterLayout, sql: str, env: dict[str, str]) -> None:
    out = subprocess.run([find_binary("mariadb") or "mariadb", "--no-defaults",
                          f"--socket={c.mysql_socket}", "-uroot", "-e", sql],
                         env=env, capture_output=True, text=True)
    if out.returncode:
        raise ClusterError(f"MariaDB statement failed: {out.stderr.strip()}. "
                           f"HINT: read {c.path('log', 'mariadb.log')}.")


def grant_db(c: L.ClusterLayout, env: dict[str, str]) -> None:
    """Let slurmdbd in as `slurm`, over TCP and over the socket."""
    pw = c.db_password
    mysql(c, "CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY '%s'; "
             "CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY '%s'; "
             "GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1'; "
             "GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost'; FLUSH PRIVILEGES;" % (pw, pw), env)


def register_cluster(c: L.ClusterLayout, run: Run) -> None:
    """Add the cluster to slurmdbd; `run(argv, check=False)` runs sacctmgr against it."""
    name = c.name
    listed = run(["sacctmgr", "-n", "-P", "list", "cluster", "format=Cluster"], check=False)
    if name in listed.stdout.split():
        return
    # slurmdbd may still be creating its tables; retry briefly.
    for _ in range(30):
        out = run(["sacctmgr", "-i", "add", "cluster", name], check=False)
        if out.returncode == 0 or "already exists" in out.stdout + out.stderr:
            return
        time.sleep(0.5)
    raise ClusterError(f"sacctmgr could not register cluster {name}: {out.stderr.strip()}. "
                       f"HINT: read {c.path('log', 'slurmdbd.log')}.")


def apply_limits(c: L.ClusterLayout, run: Run) -> None:
    """On a cluster with limits: an association for the user running `up` (account `hpc`, QOS
    normal), and QOS normal's MaxSubmitJobsPerUser as c.max_submit_jobs says (-1 clears it)."""
    if not c.limits:
        return
    user = pwd.getpwuid(os.getuid()).pw_name
    steps = [["sacctmgr", "-i", "add", "account", ACCOUNT, f"cluster={c.name}"],
             ["sacctmgr", "-i", "add", "user", user, f"account={ACCOUNT}", f"cluster={c.name}",
              f"defaultaccount={ACCOUNT}"],
             ["sacctmgr", "-i", "modify", "qos", "where", "name=normal", "set",
              f"MaxSubmitJobsPerUser={c.max_submit_jobs or -1}"]]
    for argv in steps:
        out = run(argv, check=False)
        said = out.stdout + out.stderr
        if out.returncode and "already exist" not in said and "Nothing" not in said:
            raise ClusterError(f"`{' '.join(argv)}` failed: {said.strip()}. "
                               f"HINT: read {c.path('log', 'slurmdbd.log')}.")
