"""Shared fixtures. `slurm_cluster` brings one real local SLURM cluster up for the whole session.

    python -m pytest                      # unit tests and, where SLURM is installed, cluster tests
    HPC_TEST_CLUSTER_DIR=/tmp/c pytest    # keep the cluster's files (and logs) in /tmp/c

Site variants, each its own cluster in its own directory, brought up only when a test asks for it
and taken down at the end of the session: `configless_cluster` (configless, no accounting) and
`no_accounting_cluster` (no accounting, ended jobs forgotten after MinJobAge=2 s). Their
fixtures leave the process environment alone; `site_env(cluster)` gives a test the shell of that
site (HPC_TEST_CONFIGLESS_DIR / HPC_TEST_NO_ACCOUNTING_DIR reuse a running one and leave it up).

Tests that need the cluster carry `@pytest.mark.slurm`. Outside CI they are skipped, with the reason,
when the SLURM programs are missing; in CI (CI=true) a missing SLURM fails them instead, so they
can never be skipped silently there.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

from hpc.cluster import LocalCluster
from hpc.cluster.local import missing_binaries

IN_CI = os.environ.get("CI", "").lower() in {"1", "true", "yes"}


def pytest_collection_modifyitems(config, items):
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
    directory = os.environ.get("HPC_TEST_CLUSTER_DIR") or tempfile.mkdtemp(prefix="hpc-test-cluster-")
    cluster = LocalCluster(directory)
    # A cluster already running in HPC_TEST_CLUSTER_DIR belongs to whoever started it: reuse, leave up.
    owned = not cluster.is_up()
    cluster.up(log=lambda msg: None)
    saved = os.environ.get("SLURM_CONF")
    os.environ.update(cluster.env())
    try:
        yield cluster
    finally:
        if owned:
            cluster.down(log=lambda msg: None)
        if saved is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = saved


def _variant(name: str, **kw):
    missing = missing_binaries()
    if missing:
        pytest.fail(f"SLURM programs missing: {', '.join(missing)}. HINT: python -m hpc.cluster install")
    directory = (os.environ.get(f"HPC_TEST_{name.upper()}_DIR")
                 or tempfile.mkdtemp(prefix=f"hpc-test-{name.replace('_', '-')}-"))
    # small nodes: the variants run a few one-task jobs beside the session cluster
    cluster = LocalCluster(directory, nodes=2, gpus_per_node=2, cpus_per_node=4, **kw)
    owned = not cluster.is_up()
    cluster.up(log=lambda msg: None)
    try:
        yield cluster
    finally:
        if owned:
            cluster.down(log=lambda msg: None)


@pytest.fixture(scope="session")
def configless_cluster():
    yield from _variant("configless", configless=True, accounting=False)


@pytest.fixture(scope="session")
def no_accounting_cluster():
    yield from _variant("no_accounting", accounting=False, min_job_age_s=2)


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
