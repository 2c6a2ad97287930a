"""The shape of a local cluster: its paths, ports, node names and job ids, computed without side effects.

    python -c "from hpc.cluster.layout import ClusterLayout; print(ClusterLayout.create('/tmp/hpc-cluster').all_ports())"

Everything here is pure; the files made from it are files.py's, the daemons daemons.py's.
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
    # limits=True: AccountingStorageEnforce=associations,limits,qos, as production sites set it; the
    # user who runs `up` gets an association (account `hpc`). max_submit_jobs > 0: QOS normal's
    # MaxSubmitJobsPerUser (each array task counts as a job); 0: none.
    limits: bool = False
    max_submit_jobs: int = 0
    # FirstJobId: clusters that run side by side on one host (parallel test workers, a user's two
    # clusters) start their job ids apart, since a DDP job's MASTER_PORT is derived from its job id
    # (hpc.runtime.distenv). None: from the port block (job_id_start).
    first_job_id: int | None = None
    db_password: str = field(default="hpc-local-slurm", repr=False)

    @classmethod
    def create(cls, directory: str | Path, *, nodes: int = 2, gpus_per_node: int = 4,
               cpus_per_node: int = 8, port_base: int | None = None, configless: bool = False,
               accounting: bool = True, min_job_age_s: int = 600, max_array_size: int = 1001,
               first_job_id: int | None = None, limits: bool = False,
               max_submit_jobs: int = 0) -> "ClusterLayout":
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
        if limits and not accounting:
            raise ValueError("--limits with --no-accounting: SLURM enforces limits through slurmdbd. "
                             "HINT: leave out --no-accounting.")
        if max_submit_jobs < 0 or (max_submit_jobs and not limits):
            raise ValueError(f"--max-submit-jobs {max_submit_jobs}: expected a count >= 1 (0: no limit) on a "
                             "cluster with --limits. HINT: e.g. --limits --max-submit-jobs 3.")
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
                   min_job_age_s=min_job_age_s, max_array_size=max_array_size, first_job_id=first_job_id,
                   limits=limits, max_submit_jobs=max_submit_jobs)

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
