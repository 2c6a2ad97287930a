"""A throwaway, real SLURM cluster on this machine: munge, MariaDB, slurmdbd, slurmctld, N slurmd.

    cluster = LocalCluster("/tmp/hpc-cluster")
    cluster.up()            # idempotent; returns once every node is idle
    os.environ.update(cluster.env())
    cluster.down()          # stops exactly what up() started, and the jobs still running

Nodes are several slurmd daemons on this host with fake GPUs (character devices); `low` is the
default partition, preempted with requeue by jobs in `high`. Site variants: `configless=True`
(slurmd fetches the config with --conf-server inside a private mount namespace, so its
/run/slurm/conf link stays on the node; this host's shell then plays a login node that knows only
SLURM_CONF_SERVER; munged serves the default socket: the host's own munged where one runs there, as
on a real site, else one this cluster starts) and
`accounting=False` (no MariaDB, no slurmdbd).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from hpc.cluster import accountingdb as db
from hpc.cluster import files, nodestate
from hpc.cluster import layout as L
from hpc.cluster.daemons import MARK, ClusterError, Daemon, job_processes, terminate, unix_socket_live
from hpc.cluster.daemonset import SBIN, cluster_daemons, missing_binaries, own_munged
from hpc.cluster.portclaims import PortClaims, choose_block

# Variables through which a client finds its cluster: a client of this cluster must see only ours.
CLIENT_VARS = ("SLURM_CONF", "SLURM_CONF_SERVER")


class LocalCluster:
    """`None` for a size or variant means: as saved in the directory, else the default."""

    def __init__(self, directory: str | Path, *, nodes: int | None = None, gpus_per_node: int | None = None,
                 cpus_per_node: int | None = None, port_base: int | None = None,
                 configless: bool | None = None, accounting: bool | None = None,
                 min_job_age_s: int | None = None, max_array_size: int | None = None,
                 first_job_id: int | None = None, limits: bool | None = None,
                 max_submit_jobs: int | None = None):
        existing = L.ClusterLayout.load(directory)
        given = dict(nodes=nodes, gpus_per_node=gpus_per_node, cpus_per_node=cpus_per_node,
                     configless=configless, accounting=accounting, min_job_age_s=min_job_age_s,
                     max_array_size=max_array_size, first_job_id=first_job_id, limits=limits,
                     max_submit_jobs=max_submit_jobs,
                     # keep the ports already chosen for this directory (they may have been moved off a busy block)
                     port_base=port_base)
        kw = {k: v if v is not None else getattr(existing, k) if existing else None for k, v in given.items()}
        self.layout = L.ClusterLayout.create(directory, **{k: v for k, v in kw.items() if v is not None})
        self._ports_given = port_base is not None  # a block the caller named is never moved

    # Public API ---------------------------------------------------------------------------
    @property
    def dir(self) -> Path:
        return Path(self.layout.dir)

    @property
    def conf(self) -> Path:
        return self.layout.conf

    @property
    def nodes(self) -> list[str]:
        return self.layout.node_names

    def env(self) -> dict[str, str]:
        """What a shell of this site exports (see ClusterLayout.env)."""
        return self.layout.env()

    def client_env(self) -> dict[str, str]:
        """This process's environment as a login shell of the site has it: another cluster's
        SLURM_CONF or SLURM_CONF_SERVER removed, this one's set."""
        env = {k: v for k, v in os.environ.items() if k not in CLIENT_VARS}
        env.update(self.env())
        env["PATH"] = env.get("PATH", "") + os.pathsep + os.pathsep.join(SBIN)
        return env

    def up(self, timeout_s: float = 120.0, log=print) -> None:
        missing = missing_binaries()
        if missing:
            raise ClusterError(f"missing programs: {', '.join(missing)}. HINT: run "
                               "`python -m hpc.cluster install` (as root), or "
                               "`apt-get install -y slurm-wlm slurmdbd mariadb-server munge`.")
        if self.is_up():
            self.layout.save()  # a new --max-submit-jobs takes effect at once (slurmdbd tells slurmctld)
            db.apply_limits(self.layout, self._run)
            log(f"cluster {self.layout.name} already up in {self.dir}")
            return
        self._choose_munged(log)
        self._choose_ports(self._daemons(), log)
        try:
            self._start_daemons(log)
        finally:  # started, its daemons hold the ports; failed, the block is free again
            PortClaims().release(self.dir)
        nodestate.wait_answering(self._run, self.nodes, timeout_s, self.layout.path("log"))
        shell = " ".join(f"{k}={v}" for k, v in self.env().items())
        log(f"cluster {self.layout.name} up ({self.variant()}): nodes {self.layout.nodelist}, partitions "
            f"low (default) and high. Use it with: export {shell}"
            + ("; unset SLURM_CONF" if self.layout.configless else ""))

    def _start_daemons(self, log) -> None:
        daemons = self._daemons()  # on the block chosen
        files.write(self.layout)
        env = self._daemon_env()
        by_name = {d.name: d for d in daemons}
        if "munged" in by_name:
            log("starting munged"); by_name["munged"].start(env)
        if self.layout.accounting:
            db.init_db(self.layout, env)
            log("starting mariadbd"); by_name["mariadbd"].start(env)
            db.grant_db(self.layout, env)
            log("starting slurmdbd"); by_name["slurmdbd"].start(env)
            db.register_cluster(self.layout, self._run)
            db.apply_limits(self.layout, self._run)
        log("starting slurmctld"); by_name["slurmctld"].start(env)
        for d in daemons:
            if d.name.startswith("slurmd-"):
                log(f"starting {d.name}"); d.start(self._slurmd_env())

    def variant(self) -> str:
        c = self.layout
        return ", ".join([("configless" if c.configless else "slurm.conf"),
                          ("accounting" if c.accounting else "no accounting")]
                         + ([f"limits (max submit jobs per user: {c.max_submit_jobs or 'none'})"] if c.limits else []))

    def is_up(self) -> bool:
        """Every daemon of this cluster runs and every node answers."""
        return (L.ClusterLayout.load(self.dir) is not None and all(d.pid() for d in self._daemons())
                and nodestate.answering(self._run, self.nodes))

    def down(self, log=print) -> None:
        if L.ClusterLayout.load(self.dir) is None:
            log(f"no cluster in {self.dir}")
            return
        daemons = self._daemons()
        if self._slurmctld(daemons).pid():  # cancel jobs first so their steps end cleanly
            nodestate.cancel_all(self._run)
        leftovers = job_processes(self.conf, self.dir)
        for d in reversed(daemons):
            if d.stop():
                log(f"stopped {d.name}")
        leftovers += job_processes(self.conf, self.dir)
        if leftovers:
            terminate(sorted(set(leftovers)), timeout_s=5)
            log(f"stopped {len(set(leftovers))} leftover job processes")
        spool = self.layout.spool
        if not str(spool).startswith(str(self.dir) + os.sep):  # kept outside a deep directory (layout.spool)
            shutil.rmtree(spool, ignore_errors=True)

    def settle(self, timeout_s: float = 60.0) -> None:
        """Cancel every job and wait until each node is idle and answering (hpc.cluster.nodestate.settle):
        the state a test of the cluster starts from."""
        nodestate.settle(self._run, self.nodes, timeout_s, self.layout.path("log"))

    def status(self) -> str:
        lines, daemons = [], self._daemons()
        for d in daemons:
            pid = d.pid()
            lines.append(f"{d.name:12s} {'running pid ' + str(pid) if pid else 'stopped'}")
        if self._slurmctld(daemons).pid():
            lines.append(self._run(["sinfo"], check=False).stdout.rstrip())
        return "\n".join(lines)

    def stop_daemon(self, name: str) -> bool:
        """Stop one daemon ('slurmctld', 'slurmdbd', 'slurmd-n1') as an outage or a restart does: SIGTERM,
        so it saves its state; jobs and the other daemons run on. False if it was not running."""
        return self._daemon(name).stop()

    def start_daemon(self, name: str) -> int:
        """Start again a daemon stop_daemon stopped: the same command line and state; its pid."""
        return self._daemon(name).start(self._slurmd_env() if name.startswith("slurmd-") else self._daemon_env())

    def _daemon(self, name: str) -> Daemon:
        daemons = {d.name: d for d in self._daemons()}
        if name not in daemons:
            raise ClusterError(f"no daemon {name!r} in cluster {self.dir}; expected one of {', '.join(daemons)}. "
                               "HINT: slurmdbd runs only on a cluster with accounting.")
        return daemons[name]

    def run(self, argv: list[str], check: bool = True) -> subprocess.CompletedProcess:
        """Run a SLURM client command against this cluster."""
        return self._run(argv, check=check)

    # Internals ---------------------------------------------------------------------------
    @property
    def _host_munged(self) -> Path:
        """Present while a configless cluster uses the host's munged instead of its own."""
        return self.layout.path("munge", "host-munged")

    def _choose_munged(self, log) -> None:
        """A configless cluster's daemons and clients all reach munged at the default socket. Where
        the host already runs one there (apt's munge package starts it on most machines), they use
        it, as on a real site: it is not ours to stop. A socket file nobody answers on is a leftover
        of a killed munged, and is removed so ours can bind it."""
        c = self.layout
        if not c.configless or own_munged(c).pid():
            return
        self._host_munged.unlink(missing_ok=True)
        if unix_socket_live(c.munge_socket):
            self._host_munged.parent.mkdir(parents=True, exist_ok=True)
            self._host_munged.write_text(f"{c.munge_socket}\n")
            log(f"using the munged that already serves {c.munge_socket}")
        elif c.munge_socket.exists():
            c.munge_socket.unlink()

    def _daemons(self) -> list[Daemon]:
        return cluster_daemons(self.layout, with_munged=not self._host_munged.exists(),
                               controller_up=lambda: "UP" in self._run(["scontrol", "ping"], check=False).stdout)

    @staticmethod
    def _slurmctld(daemons: list[Daemon]) -> Daemon:
        return next(d for d in daemons if d.name == "slurmctld")

    def _choose_ports(self, daemons: list[Daemon], log) -> None:
        if not any(d.pid() for d in daemons):  # partly running: its ports are ours
            self.layout = choose_block(self.layout, self.dir, self._ports_given, log)

    def _daemon_env(self) -> dict[str, str]:
        """slurmctld (and slurmdbd, sacctmgr) read the controller's own files."""
        env = {k: v for k, v in self.client_env().items() if k not in CLIENT_VARS}
        env.update(SLURM_CONF=str(self.conf), **{MARK: str(self.dir)})
        return env

    def _slurmd_env(self) -> dict[str, str]:
        """A configless slurmd has only --conf-server to go by."""
        env = self._daemon_env()
        if self.layout.configless:
            del env["SLURM_CONF"]
        return env

    def _run(self, argv: list[str], check: bool = True) -> subprocess.CompletedProcess:
        env = self._daemon_env() if argv[0] == "sacctmgr" else self.client_env()
        out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
        if check and out.returncode:
            raise ClusterError(f"`{' '.join(argv)}` failed ({out.returncode}): {out.stderr.strip()}")
        return out
