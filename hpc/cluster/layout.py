"""The shape of a local cluster: its paths, ports and config files, computed without side effects.

    layout = ClusterLayout.create("/tmp/hpc-cluster", nodes=2, gpus_per_node=4)
    print(render_slurm_conf(layout))

Everything here is pure so the generated files can be checked against golden copies; `daemons.py`
does the acting.
"""

from __future__ import annotations

import hashlib
import json
import socket
from dataclasses import asdict, dataclass, field
from pathlib import Path

# Each cluster takes a block of this many consecutive ports: ctld, dbd, mysql, then one per node.
PORT_BLOCK = 32
# Below the range hpc.runtime.envparse derives MASTER_PORT from (20000+), so a rendezvous never lands on a daemon.
PORT_RANGE = (10000, 20000)
PORT_BLOCKS = (PORT_RANGE[1] - PORT_RANGE[0]) // PORT_BLOCK  # blocks in the range
MAX_NODES = PORT_BLOCK - 3
MAX_JOB_ID = 0x03FF0000  # SLURM's largest job id (MaxJobId's default and limit)
# A block's jobs are numbered from 1 + block * JOB_ID_STRIDE: MASTER_PORT is 20000 + job id mod 12000
# (hpc.runtime.distenv), and 12038 puts the first 38 jobs of each of the 312 blocks on ports of their own.
JOB_ID_STRIDE = 12000 + 38
# slurmd's step sockets, <spool>/<node>/<node>_<job>.<step>, hold at most 107 bytes: a cluster in a
# directory too deep for that spools under SHORT_SPOOL_ROOT (`down` removes it).
SOCKET_PATH_MAX, SHORT_SPOOL_ROOT = 107, Path("/tmp")

STATE_FILE = "cluster.json"
# A configless site's clients find munged where libmunge looks by default: there is no slurm.conf to
# name another socket before the config is fetched (and no environment variable for it either).
DEFAULT_MUNGE_SOCKET = Path("/run/munge/munge.socket.2")
# Where configless clients and slurmd find the cached config (Slurm 22.05: after SLURM_CONF and
# /etc/slurm/slurm.conf, before SLURM_CONF_SERVER and DNS SRV).
RUN_CONF = Path("/run/slurm")


@dataclass(frozen=True)
class ClusterLayout:
    """Everything that identifies one local cluster; saved as cluster.json in its directory."""

    dir: str  # absolute path holding every file of the cluster
    name: str  # SLURM ClusterName (lowercase, unique per directory)
    hostname: str  # this machine's hostname: every node runs here
    port_base: int  # first port of the cluster's block
    nodes: int = 2
    gpus_per_node: int = 4
    cpus_per_node: int = 8
    mem_per_node_mb: int = 8000
    grace_time_s: int = 10  # seconds a preempted job has between SIGTERM and SIGKILL
    node_prefix: str = "n"
    # Site variants. configless: slurmctld serves its config (enable_configless), slurmd fetches it
    # with --conf-server and clients have no slurm.conf, only SLURM_CONF_SERVER (the stand-in for
    # DNS SRV records). accounting=False: no MariaDB, no slurmdbd, so sacct fails.
    configless: bool = False
    accounting: bool = True
    min_job_age_s: int = 600  # how long slurmctld (squeue, scontrol) remembers an ended job
    max_array_size: int = 1001  # MaxArraySize: an array's task ids run from 0 to this - 1 (SLURM's default)
    # FirstJobId: clusters that run side by side on one host (parallel test workers, a user's two
    # clusters) start their job ids apart, since a DDP job's MASTER_PORT is derived from its job id
    # (hpc.runtime.distenv). None: from the port block (job_id_start).
    first_job_id: int | None = None
    db_password: str = field(default="hpc-local-slurm", repr=False)

    @classmethod
    def create(cls, directory: str | Path, *, nodes: int = 2, gpus_per_node: int = 4,
               cpus_per_node: int = 8, port_base: int | None = None, configless: bool = False,
               accounting: bool = True, min_job_age_s: int = 600, max_array_size: int = 1001,
               first_job_id: int | None = None) -> "ClusterLayout":
        path = str(Path(directory).expanduser().resolve())
        if not 1 <= nodes <= MAX_NODES:
            raise ValueError(f"--nodes {nodes}: expected 1..{MAX_NODES}. HINT: pass a smaller --nodes.")
        if gpus_per_node < 0 or cpus_per_node < 1:
            raise ValueError(
                f"--gpus-per-node {gpus_per_node} / --cpus-per-node {cpus_per_node}: expected GPUs >= 0 "
                "and CPUs >= 1. HINT: e.g. --gpus-per-node 4 --cpus-per-node 8.")
        if min_job_age_s < 2:
            raise ValueError(f"--min-job-age {min_job_age_s}: expected at least 2 seconds (SLURM's minimum). "
                             "HINT: e.g. --min-job-age 10.")
        if not 1 <= max_array_size <= 4_000_001:
            raise ValueError(f"--max-array-size {max_array_size}: expected 1 to 4000001 (SLURM's range). "
                             "HINT: e.g. --max-array-size 1001, SLURM's default.")
        if first_job_id is not None and not 1 <= first_job_id <= MAX_JOB_ID:
            raise ValueError(f"first job id {first_job_id}: expected 1 to {MAX_JOB_ID} (SLURM's range). "
                             "HINT: e.g. 1, SLURM's default.")
        if port_base is not None and not 1024 <= port_base <= 65536 - PORT_BLOCK:
            raise ValueError(f"--port-base {port_base}: expected 1024 to {65536 - PORT_BLOCK} (the cluster takes "
                             f"{PORT_BLOCK} ports from it). HINT: leave it out to take a free block, or e.g. "
                             f"--port-base {PORT_RANGE[0]}.")
        digest = hashlib.sha1(path.encode()).hexdigest()
        if port_base is None:
            port_base = default_port_base(path)
        return cls(dir=path, name="hpc" + digest[:8], hostname=socket.gethostname().split(".")[0],
                   port_base=port_base, nodes=nodes, gpus_per_node=gpus_per_node,
                   cpus_per_node=cpus_per_node, configless=configless, accounting=accounting,
                   min_job_age_s=min_job_age_s, max_array_size=max_array_size, first_job_id=first_job_id)

    @property
    def job_id_start(self) -> int:
        """The first job id: as given, else from the port block (see JOB_ID_STRIDE)."""
        given = self.first_job_id
        return given if given is not None else 1 + (self.port_base // PORT_BLOCK) % PORT_BLOCKS * JOB_ID_STRIDE

    @property
    def spool(self) -> Path:
        """slurmd's spool root: in the cluster's directory when every step socket's path fits there."""
        node = max(self.node_names, key=len)
        socket = f"/{node}/{node}_{'9' * len(str(MAX_JOB_ID))}.4294967291"
        here = Path(self.dir, "spool")
        return here if len(str(here)) + len(socket) <= SOCKET_PATH_MAX else SHORT_SPOOL_ROOT / f"{self.name}-spool"

    # Ports ---------------------------------------------------------------------------------
    @property
    def ctld_port(self) -> int:
        return self.port_base

    @property
    def dbd_port(self) -> int:
        return self.port_base + 1

    @property
    def mysql_port(self) -> int:
        return self.port_base + 2

    def node_port(self, index: int) -> int:
        return self.port_base + 3 + index

    def all_ports(self) -> list[int]:
        return [self.ctld_port, self.dbd_port, self.mysql_port] + [
            self.node_port(i) for i in range(self.nodes)]

    # Names and paths -----------------------------------------------------------------------
    @property
    def node_names(self) -> list[str]:
        return [f"{self.node_prefix}{i + 1}" for i in range(self.nodes)]

    @property
    def nodelist(self) -> str:
        return f"{self.node_prefix}[1-{self.nodes}]" if self.nodes > 1 else self.node_names[0]

    def path(self, *parts: str) -> Path:
        return Path(self.dir, *parts)

    @property
    def conf(self) -> Path:
        return self.path("etc", "slurm.conf")

    @property
    def munge_socket(self) -> Path:
        return DEFAULT_MUNGE_SOCKET if self.configless else self.path("munge", "munge.socket")

    @property
    def conf_server(self) -> str:
        """host:port a configless slurmd or client fetches the config from."""
        return f"127.0.0.1:{self.ctld_port}"

    @property
    def mysql_socket(self) -> Path:
        return self.path("db", "mysqld.sock")

    def env(self) -> dict[str, str]:
        """Variables a shell of this site has to talk to the cluster. A configless site's login
        shell has no SLURM_CONF: clients fetch the config from the controller."""
        if self.configless:
            return {"SLURM_CONF_SERVER": self.conf_server}
        return {"SLURM_CONF": str(self.conf)}

    # Persistence ---------------------------------------------------------------------------
    def save(self) -> None:
        data = {k: v for k, v in asdict(self).items() if k != "db_password"}
        self.path(STATE_FILE).write_text(json.dumps(data, indent=2) + "\n")

    @classmethod
    def load(cls, directory: str | Path) -> "ClusterLayout | None":
        state = Path(directory).expanduser().resolve() / STATE_FILE
        if not state.exists():
            return None
        return cls(**json.loads(state.read_text()))


def default_port_base(path: str) -> int:
    """A port block derived from the directory, so two clusters in two directories differ."""
    index = int(hashlib.sha1(path.encode()).hexdigest(), 16) % PORT_BLOCKS
    return PORT_RANGE[0] + index * PORT_BLOCK


def render_slurm_conf(c: ClusterLayout) -> str:
    d = c.dir
    gres = f" Gres=gpu:{c.gpus_per_node}" if c.gpus_per_node else ""
    nodes = "\n".join(f"NodeName={n} NodeHostname={c.hostname} NodeAddr=127.0.0.1 Port={c.node_port(i)} "
                       f"CPUs={c.cpus_per_node} RealMemory={c.mem_per_node_mb}{gres} State=UNKNOWN"
                       for i, n in enumerate(c.node_names))
    return f"""\
# Local SLURM cluster generated by `python -m hpc.cluster up`; regenerated on every `up`.
ClusterName={c.name}
SlurmctldHost={c.hostname}(127.0.0.1)
SlurmctldPort={c.ctld_port}
SlurmdPort={c.node_port(0)}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={c.munge_socket}
CredType=cred/munge
MpiDefault=none
# No cgroups on this machine: track processes through /proc and bind nothing.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
# Nodes may declare more CPUs and memory than the machine has, so one host can stand in for many.
SlurmdParameters=config_overrides
ReturnToService=2
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
GresTypes=gpu
StateSaveLocation={d}/state
SlurmdSpoolDir={c.spool}/%n
SlurmctldPidFile={d}/run/slurmctld.pid
SlurmdPidFile={d}/run/slurmd-%n.pid
SlurmctldLogFile={d}/log/slurmctld.log
SlurmdLogFile={d}/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
# Short timers keep tests and rehearsals quick.
KillWait=5
MinJobAge={c.min_job_age_s}
InactiveLimit=0
MessageTimeout=20
SlurmdTimeout=300
SchedulerParameters=sched_interval=1
JobRequeue=1
MaxArraySize={c.max_array_size}
# SLURM's default (10,000) counts each task of a held array: sbatch would block at 10,000-task sweeps.
MaxJobCount=100000
{f"FirstJobId={c.job_id_start}{chr(10)}" if c.job_id_start != 1 else ""}{_accounting(c) + _configless(c)}# A job in `low` that a `high` job needs the nodes of gets SIGTERM, GraceTime seconds, then requeue.
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
{nodes}
PartitionName=low Nodes={c.nodelist} Default=YES MaxTime=INFINITE State=UP PriorityTier=1 PreemptMode=REQUEUE GraceTime={c.grace_time_s}
PartitionName=high Nodes={c.nodelist} MaxTime=INFINITE State=UP PriorityTier=2 PreemptMode=OFF
"""


def _accounting(c: ClusterLayout) -> str:
    if not c.accounting:
        return ("# No accounting storage: sacct fails with \"Slurm accounting storage is disabled\";\n"
                "# squeue and scontrol know a job until MinJobAge seconds after it ended.\n"
                "AccountingStorageType=accounting_storage/none\n")
    return f"""\
# Accounting through slurmdbd, so sacct answers.
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort={c.dbd_port}
# Clients reach slurmdbd through this cluster's own munged, not the system one.
AccountingStoragePass={c.munge_socket}
AccountingStorageTRES=gres/gpu
JobAcctGatherType=jobacct_gather/linux
JobAcctGatherFrequency=30
"""


def _configless(c: ClusterLayout) -> str:
    if not c.configless:
        return ""
    return ("# Configless: slurmd and clients fetch this file (and gres.conf) from slurmctld.\n"
            "SlurmctldParameters=enable_configless\n")


def render_gres_conf(c: ClusterLayout) -> str:
    if not c.gpus_per_node:
        return "# no GPUs\n"
    last = c.gpus_per_node - 1
    rng = f"[0-{last}]" if last else "0"
    return "".join(f"NodeName={n} Name=gpu File={c.dir}/dev/{n}-gpu{rng}\n" for n in c.node_names)


def render_slurmdbd_conf(c: ClusterLayout) -> str:
    d = c.dir
    return f"""\
AuthType=auth/munge
AuthInfo=socket={c.munge_socket}
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort={c.dbd_port}
SlurmUser=root
LogFile={d}/log/slurmdbd.log
PidFile={d}/run/slurmdbd.pid
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort={c.mysql_port}
StorageUser=slurm
StoragePass={c.db_password}
StorageLoc=slurm_acct_db
"""


def fake_gpu_paths(c: ClusterLayout) -> list[Path]:
    """Character devices standing in for GPUs (gres.conf rejects plain files)."""
    return [c.path("dev", f"{n}-gpu{g}") for n in c.node_names for g in range(c.gpus_per_node)]
