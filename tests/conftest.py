"""Shared fixtures. `slurm_cluster` brings one real local SLURM cluster up for the whole session.

    python -m pytest                      # unit tests and, where SLURM is installed, cluster tests
    HPC_TEST_CLUSTER_DIR=/tmp/c pytest    # keep the cluster's files (and logs) in /tmp/c

Site variants, each its own cluster in its own directory, brought up only when a test asks for it
and taken down at the end of the session: `configless_cluster` (configless, no accounting) and
`no_accounting_cluster` (no accounting, ended jobs forgotten after MinJobAge=2 s), and
`limits_cluster` (AccountingStorageEnforce, a submit limit per user). Their
fixtures leave the process environment alone; `site_env(cluster)` gives a test the shell of that
site (HPC_TEST_CONFIGLESS_DIR / HPC_TEST_NO_ACCOUNTING_DIR reuse a running one and leave it up).

Tests that need the cluster carry `@pytest.mark.slurm`. Outside CI they are skipped, with the reason,
when the SLURM programs are missing; in CI (CI=true) a missing SLURM fails them instead, so they
can never be skipped silently there.

In parallel (pytest-xdist, `-n 4 --dist loadfile` in pyproject.toml) each test file runs on one
worker, longest files first (FILE_SECONDS below), and every worker that runs a SLURM test brings up
its own cluster (its own directory and port block, and with it its own job ids, so DDP jobs of two
clusters never share a MASTER_PORT: hpc.cluster.layout.JOB_ID_STRIDE); each test starts on that cluster's empty queue with every node idle. Most of a SLURM test's time is waiting on the
scheduler, not the CPU, so clusters side by side divide it. The site variants share one file, so
one worker: a configless cluster's munged serves the host's default socket, which a second
configless cluster elsewhere would lose when the first is taken down. `-n 0` runs everything in
one process.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import warnings
from pathlib import Path

import pytest

from hpc.cluster import LocalCluster
from hpc.cluster.daemonset import missing_binaries
from hpc.cluster.layout import PORT_BLOCK, PORT_RANGE
from hpc.cluster.portclaims import free_port_block
from tests.pycache import seed_pycache

IN_CI = os.environ.get("CI", "").lower() in {"1", "true", "yes"}

# Four workers and their jobs share the machine's cores, so torch's idle OpenMP threads must sleep,
# not spin: a spinning pool costs about 3x the CPU of the same training on a busy 2-core machine
# (LangSplat's default scene: 52 s against 17 s), with the same numbers. Set here, before any test
# imports torch, it reaches every process the tests start: the xdist workers, the subprocesses and
# (sbatch passes the environment on) the jobs on the local cluster.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

# Every process the tests start imports hpc and the tests' helpers from source: the checkout, or a
# run's code snapshot (hpc.rundir.snapshot, gitignored __pycache__ left out). Where the environment
# sets PYTHONDONTWRITEBYTECODE, as CI images often do, each of those processes compiled every module
# it imports once more: about 0.1 s of CPU for the 50-odd modules of a job's start, in over a
# thousand processes per run. Their bytecode goes to one cache outside every tree instead (nothing
# is written into a checkout or a snapshot), so each file is compiled once per path.
# A cache prefix is also the only place Python then looks for bytecode: the installed packages' own
# (torch, lightning, the standard library: compiled at install) would be compiled again, about 6 s
# of CPU for torch and Lightning, in each process that imports them first, four workers at once.
# So they are linked into the cache first, by the controller before it starts the workers.
if "PYTHONPYCACHEPREFIX" not in os.environ:
    os.environ["PYTHONPYCACHEPREFIX"] = os.path.join(tempfile.gettempdir(), f"hpc-tests-pycache-{os.getuid()}")
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    if "PYTEST_XDIST_WORKER" not in os.environ:
        seed_pycache(os.environ["PYTHONPYCACHEPREFIX"])

VARIANTS = ("main", "configless", "no_accounting", "limits")


def _worker_index() -> int:
    """0 in a serial run, else this xdist worker's number (gw0, gw1, ...)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    return int(worker[2:]) if worker[2:].isdigit() else 0


def _cluster_dir(env_var: str, prefix: str) -> str:
    given = os.environ.get(env_var)
    if given and "PYTEST_XDIST_WORKER" in os.environ:
        return f"{given}-{os.environ['PYTEST_XDIST_WORKER']}"  # one cluster per worker
    return given or tempfile.mkdtemp(prefix=prefix)


def _cluster_args(variant: str) -> dict:
    """A free block of ports for this worker's cluster of `variant` (its job ids come with it)."""
    slot = _worker_index() * len(VARIANTS) + VARIANTS.index(variant)
    args = {}
    base = free_port_block(PORT_RANGE[0] + slot * 37 * PORT_BLOCK)  # from a block of its own
    if base is not None:
        args["port_base"] = base
    return args


def _start(make, directory: str) -> LocalCluster:
    """Bring a cluster up; if it does not come up (a daemon slow to start on a loaded machine),
    take down what started and try once more in a fresh directory, saying why."""
    cluster = make(directory)
    try:
        cluster.up(log=lambda msg: None)
        return cluster
    except Exception as err:  # noqa: BLE001 - reported with the retry, raised if that fails too
        cluster.down(log=lambda msg: None)
        warnings.warn(f"local cluster in {directory} did not come up ({err}); trying a fresh directory")
    cluster = make(tempfile.mkdtemp(prefix=Path(directory).name.rstrip("-_") + "-retry-"))
    cluster.up(log=lambda msg: None)
    return cluster


# Seconds each test file took in a full run (tests/durations.py writes it from a --junitxml report).
# The workers take whole files in collection order, so the longest go first, as in longest-processing-
# time scheduling: the run then ends when the total work does, not one long file later. A file the
# table lacks goes last; a stale table only costs balance, never a test.
FILE_SECONDS = Path(__file__).with_name("file_durations.json")


def longest_files_first(items: list) -> None:
    """Reorder `items` in place: files by their recorded seconds, longest first, each file's tests in
    their own order (module fixtures stay shared). The order is the same in every worker."""
    import json

    try:
        seconds = json.loads(FILE_SECONDS.read_text())
    except (FileNotFoundError, ValueError):
        return
    first = {}  # file -> position of its first test
    for i, item in enumerate(items):
        first.setdefault(item.nodeid.split("::")[0], i)

    def key(item) -> tuple:
        path = item.nodeid.split("::")[0]
        return -seconds.get(path, 0.0), first[path]
    items.sort(key=key)


def pytest_collection_modifyitems(config, items):
    longest_files_first(items)
    missing = missing_binaries()
    if not missing or IN_CI:
        return
    skip = pytest.mark.skip(reason=f"SLURM not installed here (missing {', '.join(missing)}); "
                                   "run `python -m hpc.cluster install` to run these tests")
    for item in items:
        if "slurm" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def slurm_cluster():
    missing = missing_binaries()
    if missing:
        pytest.fail(f"SLURM programs missing: {', '.join(missing)}. HINT: python -m hpc.cluster install")
    directory = _cluster_dir("HPC_TEST_CLUSTER_DIR", "hpc-test-cluster-")
    cluster = LocalCluster(directory)
    # A cluster already running in HPC_TEST_CLUSTER_DIR belongs to whoever started it: reuse, leave up.
    owned = not cluster.is_up()
    if owned:
        # nodes of 8 GPUs and 8 CPUs: a whole node holds 8 one-GPU items packed (tests/slurm/test_packing.py)
        cluster = _start(lambda d: LocalCluster(d, gpus_per_node=8, cpus_per_node=8, **_cluster_args("main")), directory)
    saved = os.environ.get("SLURM_CONF")
    os.environ.update(cluster.env())
    try:
        yield cluster
    finally:
        if owned:
            _take_down(cluster)
        if saved is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = saved


def _variant(name: str, **kw):
    missing = missing_binaries()
    if missing:
        pytest.fail(f"SLURM programs missing: {', '.join(missing)}. HINT: python -m hpc.cluster install")
    directory = _cluster_dir(f"HPC_TEST_{name.upper()}_DIR", f"hpc-test-{name.replace('_', '-')}-")
    # small nodes: the variants run a few one-task jobs beside the session cluster
    cluster = LocalCluster(directory, nodes=2, gpus_per_node=2, cpus_per_node=4, **kw)
    owned = not cluster.is_up()
    if owned:
        cluster = _start(lambda d: LocalCluster(d, nodes=2, gpus_per_node=2, cpus_per_node=4, **kw,
                                                **_cluster_args(name)), directory)
    try:
        yield cluster
    finally:
        if owned:
            _take_down(cluster)


def _take_down(cluster: LocalCluster) -> None:
    """Stop a cluster this session started, and remove its directory unless it was named for us
    (a directory under HPC_TEST_*_DIR is kept for its logs)."""
    cluster.down(log=lambda msg: None)
    if Path(cluster.dir).name.startswith("hpc-test-") and Path(cluster.dir).parent == Path(tempfile.gettempdir()):
        shutil.rmtree(cluster.dir, ignore_errors=True)


@pytest.fixture(autouse=True)
def _settled_clusters(request):
    """Each SLURM test starts on an empty queue with every node idle: a test that failed midway
    cannot leave a job holding nodes, or a node not yet answering, to the next one on its worker.
    (The site-variant clusters serve one module, whose module-scoped job must outlive its tests.)"""
    if "slurm_cluster" in request.fixturenames:
        request.getfixturevalue("slurm_cluster").settle()
    yield


@pytest.fixture(scope="session")
def configless_cluster():
    yield from _variant("configless", configless=True, accounting=False)


@pytest.fixture(scope="session")
def no_accounting_cluster():
    yield from _variant("no_accounting", accounting=False, min_job_age_s=2)


@pytest.fixture(scope="session")
def limits_cluster():
    """Limits enforced as production sites do (hpc.cluster up --limits); QOS normal's
    MaxSubmitJobsPerUser starts at 3 (`up --max-submit-jobs N` changes it)."""
    yield from _variant("limits", limits=True, max_submit_jobs=3)


@pytest.fixture
def site_env(monkeypatch):
    """site_env(cluster): this test's environment becomes a login shell of that cluster's site."""
    def use(cluster: LocalCluster) -> LocalCluster:
        for key in ("SLURM_CONF", "SLURM_CONF_SERVER"):
            monkeypatch.delenv(key, raising=False)
        for key, value in cluster.env().items():
            monkeypatch.setenv(key, value)
        return cluster
    return use


@pytest.fixture
def job_dir(tmp_path: Path) -> Path:
    """A directory job processes on the cluster can write to (they run on this host as this user)."""
    d = tmp_path / "jobs"
    d.mkdir()
    return d
